"""kvtransfer: the KV data plane between prefill and decode workers, KV bytes only (see docs/DESIGN.md).

The transports behind the engine's KV connector seam (`engine.kv_connector`, which
each worker implements on its I/O thread): `connector.KVSenderBase` (prefill
side) and `connector.KVReceiverBase` (decode side), implemented by `KVSender`
and `KVReceiver` over ZMQ, optionally with a torch.distributed pair for tensor
frames; neither ever blocks its thread. Its messages live in `wire.kv`, the
handshake's check in `kvtransfer.handshake`. Names are imported lazily.
"""

import importlib

_EXPORTS = {
    "KVSender": "kvtransfer.sender",
    "KVReceiver": "kvtransfer.receiver",
    "KVSenderBase": "kvtransfer.connector",
    "KVReceiverBase": "kvtransfer.connector",
    "PeerTarget": "kvtransfer.connector",
    "TransferEvent": "kvtransfer.connector",
    "TransferTimeouts": "kvtransfer.connector",
    "KVSpec": "wire.kv",
    "IncompatiblePeerError": "kvtransfer.handshake",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvtransfer' has no attribute {name!r}")
