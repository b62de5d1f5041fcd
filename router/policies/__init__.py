"""Routing policies, one per file; `router.policy` registers them by name."""
