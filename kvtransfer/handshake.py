"""The KV handshake's compatibility check: may this sender's blocks land in our cache?"""

from __future__ import annotations

from kvtransfer.resharding import check_tp_pair
from wire.kv import PROTOCOL_VERSION, Hello, KVSpec, compat_hash


class IncompatiblePeerError(RuntimeError):
    """The peer speaks another protocol version or holds a cache of another shape/model/dtype."""


def check_hello(hello: Hello, local: KVSpec, local_tp: int) -> None:
    """Raise `IncompatiblePeerError` naming what differs, or return if the peer may send to us."""
    if hello.version != PROTOCOL_VERSION:
        raise IncompatiblePeerError(f"protocol version {hello.version} != ours {PROTOCOL_VERSION}")
    if hello.compat_hash != compat_hash(local):
        diffs = [
            f"{name}: peer {getattr(hello.spec, name)!r} != ours {getattr(local, name)!r}"
            for name in KVSpec.__dataclass_fields__
            if getattr(hello.spec, name) != getattr(local, name)
        ]
        raise IncompatiblePeerError("incompatible KV cache: " + ("; ".join(diffs) or "compat hash differs"))
    check_tp_pair(local.num_kv_heads, hello.tp_size, local_tp)
