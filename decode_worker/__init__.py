"""decode_worker: an engine in the decode role plus a KV receiver and a token stream (see ../shared/DESIGN.md).

`worker.DecodeWorker` is the plain class (steppable from a test); `actor.DecodeActor`
is its Ray actor shell. It meets prefill workers only through `kvtransfer` messages.
"""
