"""prefill_worker: an engine in the prefill role plus a KV sender (see ../shared/DESIGN.md).

`worker.PrefillWorker` is the plain class (steppable from a test); `actor.PrefillActor`
is its Ray actor shell. It meets decode workers only through `kvtransfer` messages.
"""
