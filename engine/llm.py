"""Offline batch generation in vLLM's shape: `LLM(model).generate(prompts, params)`.

The frontend owns the outputs' text (`engine.offline_text`): the engine core
streams token ids, and a request whose stop string matched is aborted there.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from tqdm import tqdm

from engine.llm_engine import EngineArgs, LLMEngine, Prompt
from engine.offline_text import OfflineText
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, skip_tokenizer_init: bool = False, **engine_args):
        self.engine = LLMEngine.from_args(EngineArgs(model=model, **engine_args), skip_tokenizer_init=skip_tokenizer_init)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One output per prompt, in prompt order; with n > 1 it holds n completions."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        texts = OfflineText(self.engine.tokenizer)
        groups = self._add_all(prompts, params, texts)
        finished: dict[str, RequestOutput] = {}
        total = sum(len(g) for g in groups)
        with tqdm(total=total, desc="Generating", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished_requests():
                for out in map(texts.advance, self.engine.step()):
                    if out.finished:
                        self.engine.abort_request(out.request_id)  # ended by a stop string (else a no-op)
                        finished[out.request_id] = out
                        bar.update(1)
        return [_merge([finished[rid] for rid in group]) for group in groups]

    def _add_all(self, prompts: list[Prompt], params: list[SamplingParams], texts: OfflineText) -> list[list[str]]:
        """Queue every prompt, or none: one bad prompt withdraws those already queued."""
        groups: list[list[str]] = []
        try:
            for prompt, p in zip(prompts, params):
                groups.append([])
                self._add(prompt, p, groups[-1], texts)
        except ValueError:
            for rid in (rid for group in groups for rid in group):
                self.engine.abort_request(rid)
            raise
        return groups

    def _add(self, prompt: Prompt, params: SamplingParams, ids: list[str], texts: OfflineText) -> None:
        base = str(next(self._ids))
        for j in range(params.n):
            child = params if params.n == 1 else _child_params(params, j)
            rid = base if params.n == 1 else f"{base}-{j}"
            self.engine.add_request(rid, prompt, child)
            ids.append(rid)
            texts.open(rid, self.engine.requests[rid].prompt_token_ids, child)


def _child_params(params: SamplingParams, j: int) -> SamplingParams:
    seed = None if params.seed is None else params.seed + j
    return replace(params, n=1, seed=seed)


def _merge(outs: list[RequestOutput]) -> RequestOutput:
    first = outs[0]
    if len(outs) == 1:
        return first
    completions = []
    for j, out in enumerate(outs):
        completions.append(replace(out.outputs[0], index=j))
    return replace(first, request_id=first.request_id.rsplit("-", 1)[0], outputs=completions)


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    return list(prompts)


def _as_params_list(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} sampling params for {n} prompts")
    return list(params)
