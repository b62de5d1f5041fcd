"""cluster: the `tandem` CLI, the cluster spec, and the controller that keeps pools of workers on Ray (see docs/DESIGN.md).

Ray starts, places and watches the worker actors; the router's requests go over
each worker's control socket (`wire.control`), not over Ray.
"""
