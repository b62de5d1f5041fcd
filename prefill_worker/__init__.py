"""prefill_worker: see ../shared/DESIGN.md; built in its own issue."""
