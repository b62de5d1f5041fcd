"""prefill_worker: an engine in the prefill role plus a KV sender (see docs/DESIGN.md).

`worker.PrefillWorker` is the loop-thread logic (steppable from a test), `records` its
per-request state machine, `kv_sending` the KV service on the I/O thread; `actor.PrefillActor`
hosts it in a Ray actor. It meets decode workers only through `wire` messages.
"""
