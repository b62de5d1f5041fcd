"""bench_cluster.py's parts: the sweeps, the servers it starts, the report it writes."""
