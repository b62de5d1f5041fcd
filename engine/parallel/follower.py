"""The loop a tensor-parallel rank > 0 runs: receive rank 0's step, run the forward, repeat.

A worker process of rank r > 0 does `TPFollower(config).run()` while rank 0
runs `LLMEngine(config)` (same config but for `parallel.rank`); `run()` returns
when rank 0's `LLMEngine.shutdown()` sends the shutdown message. `on_step`
gets each step's attachment (bytes rank 0's caller added, usually empty)
before that step's forward: a prefill worker's follower learns there which
KV transfers the forward starts.
"""

from __future__ import annotations

from typing import Callable

from engine.config import EngineConfig
from engine.model_runner import ModelRunner


class TPFollower:
    """Rank > 0: holds its weight shard and its KV heads' cache, and nothing else.

    It owns no requests and no blocks: rank 0's scheduler decides every step's
    slots and block tables, and this rank's cache mirrors that block layout for
    its own KV heads. It samples nothing (rank 0 holds the full logits).
    """

    def __init__(self, config: EngineConfig, show_progress: bool = False):
        if config.parallel.rank == 0:
            raise ValueError("rank 0 of a tensor-parallel engine runs LLMEngine, not TPFollower")
        self.config = config
        self.runner = ModelRunner(config, show_progress=show_progress)
        self.on_step: Callable[[bytes], None] | None = None

    def run(self) -> int:
        """Run steps until rank 0 shuts down; return how many ran. Leaves the process group."""
        steps = 0
        try:
            while (step := self.runner.receive_step()) is not None:
                batch, attachment = step
                if self.on_step is not None:
                    self.on_step(attachment)
                self.runner.forward(batch)
                steps += 1
        finally:
            self.runner.shutdown()
        return steps
