"""The prefix cache's tenant salt (vLLM's `cache_salt`), written once for every hash of a prompt's blocks.

A request may carry a string `cache_salt`. Its seed is mixed into what the first
full block's hash chains from, so that block's hash, and every later one (each
chains from the one before), differs from an unsalted request's and from
another salt's: requests of different tenants never share prefix-cache blocks
(CVE-2025-46570: a hit is faster, so a shared cache leaks whether someone else
sent a prompt). Requests with the same salt share blocks as before.

Two hashes name blocks, and both take the salt from here, each in its own form:
the engine's blake2b chain (`engine.block_pool.chain_root`: its block pool, hence
the prefill worker's cache and decode's reservation of cached blocks) and the
router's guess of where a prefix is cached (`router.block_keys`). No salt
(absent or empty) gives an empty seed: both hashes are exactly today's.
"""

from __future__ import annotations

import hashlib

MAX_CACHE_SALT_CHARS = 256  # a tenant's name or key id, not a payload: the router refuses longer (a 400)


def valid_cache_salt(value: object) -> bool:
    """Whether `value` may be a request's cache_salt: None (no salt) or a string of at most the bound."""
    return value is None or (isinstance(value, str) and len(value) <= MAX_CACHE_SALT_CHARS)


def salt_seed(cache_salt: str | None) -> bytes:
    """The bytes a salt mixes into the first block's hash: b"" for no salt (absent or ""), so unsalted hashes
    stay byte-identical; else a 16-byte digest of the salt (not the salt itself: any length, one size)."""
    if not cache_salt:
        return b""
    return hashlib.blake2b(cache_salt.encode("utf-8"), digest_size=16, person=b"tandem-salt").digest()
