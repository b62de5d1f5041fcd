"""decode_worker: an engine in the decode role plus a KV receiver and a token stream (see docs/DESIGN.md).

`worker.DecodeWorker` is the loop-thread logic (steppable from a test), `records` its
per-request state machine, `kv_receiving` the KV service on the I/O thread; `actor.DecodeActor`
hosts it in a Ray actor. It meets prefill workers only through `wire` messages.
"""
