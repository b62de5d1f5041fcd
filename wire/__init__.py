"""wire: what crosses a process boundary, as every Tandem process reads and writes it (see docs/DESIGN.md).

A leaf package (msgpack and ZMQ only, never torch): the one codec
(`wire.codec`), the typed messages of each channel (`kv`, `requests`,
`control`, `membership`, `ranks`, `step`), the sockets' security (`socket_security`,
`control_sockets`), ZMQ PUSH/PULL for small messages (`push_pull`) and the
rules that read a worker's heartbeat (`liveness`). Importing the package
registers every message type, so any reader can decode any nested message.
"""

from wire import control, kv, membership, ranks, requests, step  # noqa: F401  (registers the message types)
