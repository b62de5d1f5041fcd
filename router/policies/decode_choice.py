"""The decode pool's choice: the least busy worker that has KV room for the request.

Rule, over the live decode workers:
1. A worker has room if the free KV blocks it last reported cover the
   prompt's blocks plus `headroom_blocks` for the tokens it will generate
   (a worker that has not reported yet counts as having room).
2. Among workers with room: the fewest pending requests (running + waiting,
   or dispatched since, `WorkerState.pending`), then the most free blocks.
   Pending requests set a decode worker's batch, hence its time per token.
3. If no worker has room: the most free blocks, then the fewest pending; the
   worker queues the request until blocks free up, which wastes less than
   preempting somewhere fuller.

No prefix affinity: the prompt's KV arrives from the prefill worker, so a
decode worker's prefix cache saves nothing on the way in. Colocated (no prefill
pool), decode workers compute their prompts: `PromptPolicyWithRoom` lets the
prompt's policy choose among the workers rule 1 keeps (`router.policy.make_pool_policies`).
"""

from __future__ import annotations

from typing import Sequence

from router.worker_state import WorkerState


class DecodeByKVRoom:
    def __init__(self, block_size: int = 16, headroom_blocks: int = 4):
        if block_size < 1 or headroom_blocks < 0:
            raise ValueError("block_size must be >= 1 and headroom_blocks >= 0")
        self.block_size, self.headroom_blocks = block_size, headroom_blocks

    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState],
             cache_salt: str | None = None) -> WorkerState:  # fmt: skip
        if not workers:
            raise ValueError("no worker to pick from")
        roomy = self.with_room(tokens, workers)
        if roomy:
            return min(roomy, key=lambda w: (w.pending, -w.free_blocks))
        return min(workers, key=lambda w: (-w.free_blocks, w.pending))

    def with_room(self, tokens: Sequence[int], workers: Sequence[WorkerState]) -> list[WorkerState]:
        """The workers whose last reported free blocks cover the prompt and the headroom (rule 1)."""
        needed = -(-len(tokens) // self.block_size) + self.headroom_blocks
        return [w for w in workers if w.load is None or w.free_blocks >= needed]

    def forget(self, worker_name: str) -> None:
        pass


class PromptPolicyWithRoom:
    """A colocated decode pool's choice: the prompt's policy (`cache_aware`: where its prefix is cached) among
    the workers with KV room for it (`DecodeByKVRoom`'s rule 1), among all of them when none has room."""

    def __init__(self, policy, room: DecodeByKVRoom):
        self.policy, self.room = policy, room

    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState],
             cache_salt: str | None = None) -> WorkerState:  # fmt: skip
        return self.policy.pick(tokens, self.room.with_room(tokens, workers) or workers, cache_salt)

    def forget(self, worker_name: str) -> None:
        self.policy.forget(worker_name)
