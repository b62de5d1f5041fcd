"""The parts of scripts/bench_serving.py: datasets, the streaming client, the metric math, the plots."""
