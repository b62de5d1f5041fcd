"""The loop a tensor-parallel rank > 0 runs: receive rank 0's step, run the forward, repeat.

A worker process of rank r > 0 does `TPFollower(config).run()` while rank 0
runs `LLMEngine(config)` (same config but for `parallel.rank`); `run()` returns
when rank 0's `LLMEngine.shutdown()` sends the shutdown message. A follower's
KV connector (`engine.kv_connector.FollowerConnector`) gets each step's
attachment (bytes rank 0's connector added, usually empty) before that step's
forward, and each layer as its KV is written: a prefill worker's follower
learns there which KV transfers the forward starts and sends its own heads.
"""

from __future__ import annotations

from engine.config import EngineConfig
from engine.kv_connector import FollowerConnector
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
        self.kv_connector: FollowerConnector | None = None  # set before `run` by the worker built on this rank

    def run(self) -> int:
        """Run steps until rank 0 shuts down; return how many ran. Leaves the process group."""
        steps = 0
        try:
            while (step := self.runner.receive_step()) is not None:
                batch, attachment = step
                connector = self.kv_connector
                if connector is not None:
                    connector.on_step(attachment)
                self.runner.forward(batch, connector.save_layer if connector is not None else None)
                steps += 1
        finally:
            self.runner.shutdown()
        return steps
