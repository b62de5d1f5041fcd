"""router: the OpenAI-compatible HTTP front (see docs/DESIGN.md).

Admission, tokenization and chat templates (`serving`, `chat`, `completions`), the
handoff between a decode and a prefill worker (`handoff`, `dispatch`) over each worker's
control socket (`control_client`), routing policies (`policies/`), worker liveness
(`registry`, rules in `wire.liveness`), the token stream and its text (`token_stream`,
`detokenize`), errors in OpenAI's format and metrics.
"""
