"""A simulator of whole deployments that runs Tandem's own scheduling code on simulated time.

What is Tandem's own here, not a copy: each worker's engine (`engine.LLMEngine`: scheduler, block pool,
prefix cache, preemption, the prefill and decode roles of `engine.remote_kv`), the router's registry,
routing policies, local-prefill rule and TTFT admission (`router.registry`, `router.policy`,
`router.local_prefill`, `router.ttft_prediction`), and the arrival window (`runtime.arrival_window`).
What is modelled: the forward step (priced by a `costmodel.Profile` instead of computed:
`priced_runner`), the KV transfer's time, the hops between processes, and the worker loop and handoff
glue around them (`worker`, `router`), which follow `runtime.loop` and `router.handoff` step for step.
"""
