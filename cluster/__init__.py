"""cluster: see ../shared/DESIGN.md; built in its own issue."""
