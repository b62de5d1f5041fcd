"""router: the OpenAI-compatible HTTP front (see docs/DESIGN.md).

Admission, tokenization and chat templates (`serving`, `chat`, `completions`), the
handoff between a decode and a prefill worker (`handoff`, `dispatch`) over each worker's
control socket (`control_client`), routing policies (`policies/`), worker liveness
(`registry`, rules in `wire.liveness`), the token stream (`token_stream`) and the text of
every choice, stop strings included (`choice_output`, over `output_text`: the router owns
output text, workers send token ids), errors in OpenAI's format and metrics.
"""
