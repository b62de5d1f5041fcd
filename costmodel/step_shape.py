"""What one forward step computes, in the counts a step's cost depends on.

A step runs a ragged batch: some sequences compute a chunk of their prompt (a *prefill chunk*: `new`
tokens after `context` tokens already in the KV cache), others one token each (a *decode row*, reading
`context + 1` tokens of KV). The cost model (`step_cost.StepCost`) prices a step from these counts only,
so the router can price a step it has not run, and the simulator one it never will.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable


@dataclass(frozen=True)
class StepShape:
    tokens: int  # tokens through the linear layers: every prefill chunk's plus one per decode row
    sequences: int  # sequences in the batch
    sampled_rows: int  # sequences whose logits are computed and sampled (a decode row, a prompt's last chunk)
    decode_context_tokens: int  # KV tokens the decode rows' attention reads: sum of (context + 1)
    prefill_attention_pairs: float  # (query, key) pairs of the prefill chunks' causal attention
    prefill_context_tokens: int = 0  # KV tokens the prefill chunks' attention reads: sum of (context + new)
    longest_decode_context: int = 0  # the most KV tokens one decode row reads (a CPU kernel gives a row one thread)
    # The pairs of chunks after a cached prefix (counted in prefill_attention_pairs too): their attention reads
    # its keys from the cache under a mask, a whole prompt's takes the causal kernel, the cheaper per pair
    # (0.86 against 0.53 us on 2 cores of a Xeon, fitted to a profile's steps).
    prefix_attention_pairs: float = 0.0

    @classmethod
    def of(cls, prefills: Iterable[tuple[int, int, bool]] = (), decode_contexts: Iterable[int] = ()) -> "StepShape":
        """A step of prefill chunks `(new, context, samples)` and decode rows (each its `context`, the
        tokens before the one it computes)."""
        prefills, decode_contexts = list(prefills), list(decode_contexts)
        return cls(
            tokens=sum(new for new, _, _ in prefills) + len(decode_contexts),
            sequences=len(prefills) + len(decode_contexts),
            sampled_rows=sum(1 for _, _, samples in prefills if samples) + len(decode_contexts),
            decode_context_tokens=sum(c + 1 for c in decode_contexts),
            prefill_attention_pairs=sum(chunk_attention_pairs(new, context) for new, context, _ in prefills),
            prefill_context_tokens=sum(new + context for new, context, _ in prefills),
            longest_decode_context=max(decode_contexts, default=-1) + 1,
            prefix_attention_pairs=prefix_attention_pairs((new, context) for new, context, _ in prefills),
        )

    @classmethod
    def from_record(cls, record: dict) -> "StepShape":
        """The shape a kept step records (a served step's trace line, a profile's sample): its counts, other keys
        ignored; `prefix_attention_pairs`, which records of before it lack, from the step's prefill chunks where
        kept (`"chunks"`: (new, context) each), else 0."""
        counts = {f.name: record[f.name] for f in fields(cls) if f.name in record}
        if "prefix_attention_pairs" not in counts:
            counts["prefix_attention_pairs"] = prefix_attention_pairs(record.get("chunks", ()))
        return cls(**counts)

    @classmethod
    def decode(cls, rows: int, context: int) -> "StepShape":
        """`rows` decode rows, each after `context` tokens."""
        return cls.of(decode_contexts=[context] * rows)

    @classmethod
    def prefill(cls, new: int, context: int = 0, samples: bool = True) -> "StepShape":
        return cls.of(prefills=[(new, context, samples)])


def chunk_attention_pairs(new: int, context: int) -> float:
    """Causal attention of `new` query tokens after `context` cached ones: query i sees context + i + 1 keys."""
    return new * (context + (new + 1) / 2)


def prefix_attention_pairs(chunks: Iterable[tuple[int, int]]) -> float:
    """The pairs of the chunks `(new, context)` that follow a cached prefix."""
    return sum(chunk_attention_pairs(new, context) for new, context in chunks if context)
