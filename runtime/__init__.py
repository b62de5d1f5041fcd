"""runtime: how a worker of either role runs (see docs/DESIGN.md).

A loop thread owns the engine (`loop`), an I/O thread owns every socket (`io_thread`)
and answers the router's calls (`control_service`) and heartbeats from the load board
(`load_board`); `hosting` and `actor` put the pair in-process or in a Ray actor;
`follower`, `rank_links` and `rank_control_service` run tensor-parallel follower ranks,
`ray_group` places them; `engine_bridge` converts between engine types and `wire` messages.
"""
