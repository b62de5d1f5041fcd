"""kvtransfer: the KV data plane between prefill and decode workers (see ../shared/DESIGN.md).

DESIGN.md's `kvtransfer.KVConnector` seam comes in two halves,
`connector.KVSenderBase` (prefill side) and `connector.KVReceiverBase` (decode
side), implemented by `KVSender` and `KVReceiver` over ZMQ, optionally with a
torch.distributed pair for tensor frames. Messages live in `kvtransfer.protocol`.
Names are imported lazily so that `import kvtransfer.protocol` needs neither torch nor ZMQ.
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
    "KVSpec": "kvtransfer.protocol",
    "IncompatiblePeerError": "kvtransfer.protocol",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvtransfer' has no attribute {name!r}")
