"""Conversions between engine types and wire messages, for the workers (the router never imports this)."""

from __future__ import annotations

import dataclasses
import os

from engine.config import EngineConfig
from engine.request import Request
from engine.sampling_params import SamplingParams
from wire.kv import KVSpec
from wire.requests import PhaseTimes, SamplingSpec, TokenLogprob


def sampling_params(spec: SamplingSpec) -> SamplingParams:
    """Validated engine params from the wire form; raises ValueError naming a bad field."""
    return SamplingParams(**dataclasses.asdict(spec))


# What shapes only text: the text's owner keeps it (the router; `LLM` offline), no worker gets it.
TEXT_ONLY_FIELDS = ("stop", "include_stop_str_in_output", "skip_special_tokens")
_DEFAULTS = SamplingParams()


def sampling_spec(params: SamplingParams) -> SamplingSpec:
    if params.n != 1:
        raise ValueError(f"one request is one sequence: fan n={params.n} out before sending")
    text_only = [name for name in TEXT_ONLY_FIELDS if getattr(params, name) != getattr(_DEFAULTS, name)]
    if text_only:
        raise ValueError(f"{', '.join(text_only)} shape text, which workers never make: keep them with the text")
    return SamplingSpec(**{f.name: getattr(params, f.name) for f in dataclasses.fields(SamplingSpec)})


def kv_spec_for(config: EngineConfig) -> KVSpec:
    """What a KV sender and receiver built from these engine configs must agree on."""
    model = config.model
    return KVSpec(model=os.path.basename(os.path.normpath(config.model_dir)), block_size=config.cache.block_size,
                  dtype=str(config.dtype).removeprefix("torch."), num_layers=model.num_layers,
                  num_kv_heads=model.num_kv_heads, head_dim=model.head_dim)  # fmt: skip


def token_logprobs(entries: list | None, last: int) -> tuple[TokenLogprob, ...]:
    """The wire form of the `last` entries of a completion's logprobs (engine `TokenLogprobs`); () when not asked for."""
    if not entries or last <= 0:
        return ()
    # None: a token sampled elsewhere (decode's copy of prefill's first token); never among the streamed ones.
    return tuple(TokenLogprob(e.logprob, e.top) if e is not None else TokenLogprob(float("nan")) for e in entries[-last:])


def prompt_token_logprobs(entries: list | None) -> tuple[TokenLogprob | None, ...]:
    """The wire form of an engine output's prompt logprobs (first entry None); () when not asked for."""
    if not entries:
        return ()
    return tuple(TokenLogprob(e.logprob, e.top, e.rank) if e is not None else None for e in entries)


def _span(start: float | None, end: float | None) -> float:
    return max(0.0, end - start) if start is not None and end is not None else 0.0


def prompt_phases(req: Request) -> PhaseTimes:
    """Queue and prefill of a prompt this engine computed (`PhaseTimes`), from its request's times."""
    return PhaseTimes(queue_s=_span(req.arrival_time, req.first_scheduled_at),
                      prefill_s=_span(req.first_scheduled_at, req.first_token_at))  # fmt: skip


def decode_phases(req: Request, first_token_seen: float | None, kv_landed: float | None,
                  admitted: float | None) -> PhaseTimes:  # fmt: skip
    """A decode worker's phases of a request: its prompt's handoff (when prefilled elsewhere: `admitted` is set)
    or its own prefill, then the first decode step. Times on the engine's clock."""
    if admitted is None:  # prefilled here
        local = prompt_phases(req)
        return PhaseTimes(local.queue_s, local.prefill_s, first_decode_s=_span(req.first_token_at, req.second_token_at))
    ready = max((t for t in (first_token_seen, kv_landed) if t is not None), default=admitted)
    return PhaseTimes(kv_transfer_s=_span(first_token_seen, kv_landed), decode_seat_s=_span(ready, admitted),
                      first_decode_s=_span(admitted, req.second_token_at))  # fmt: skip
