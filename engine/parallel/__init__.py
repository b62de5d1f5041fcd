"""Tensor parallelism inside one engine: n processes, each holding a slice of every layer.

- `config`: `ParallelConfig` (tp size, rank, rendezvous) and the model shape checks;
- `shard`: which heads / rows / columns each rank holds (pure arithmetic);
- `group`: the process group and the all-reduce the row-parallel layers call;
- `step_broadcast`: rank 0 sends each step's batch to the other ranks;
- `follower`: the loop ranks > 0 run;
- `ray_group`: a tensor-parallel worker's n Ray actors in one placement group, started together.
"""
