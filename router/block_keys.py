"""Chain keys of a prompt's full token blocks: the router's own names for prefix-cache blocks.

Key i names the whole prefix up to the end of block i: it is the hash of
(key i-1, the block's token ids), so two prompts share key i exactly when they
share their first i+1 blocks. The keys are Python ints (`hash` of a tuple of
ints, which is the same in every process), not the engine's blake2b digests:
the router only needs to guess where a prefix is cached, and a 2,000-token
prompt hashes in about 50 µs this way. A collision costs one misrouted request.

A salted request (`cache_salt`, `wire.cache_salt`) chains from a root of its
salt, as the engines' hashes do, so its keys match only prompts of the same
salt: the router never sends a tenant where another tenant's prefix is cached
expecting a hit it cannot get. No salt: `ROOT_KEY`, the keys of before.
"""

from __future__ import annotations

from typing import Sequence

from wire.cache_salt import salt_seed

ROOT_KEY = 0  # parent key of the first block


def root_key(cache_salt: str | None = None) -> int:
    """The parent key of the first block: `ROOT_KEY`, or an int of the salt's seed (not `hash` of the string,
    which differs between processes)."""
    seed = salt_seed(cache_salt)
    return int.from_bytes(seed[:8], "little") if seed else ROOT_KEY


def block_keys(tokens: Sequence[int], block_size: int, cache_salt: str | None = None) -> list[int]:
    """One key per full block of `tokens`, in prompt order; the partial last block has none."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if not isinstance(tokens, (list, tuple)):
        tokens = list(tokens)
    keys, key = [], root_key(cache_salt)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = hash((key, tuple(tokens[start : start + block_size])))
        keys.append(key)
    return keys
