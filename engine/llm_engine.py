"""The step-by-step engine: add requests, step, abort. Workers drive it; `LLM` wraps it.

One step is three calls: `scheduler.schedule()` -> `runner.execute(batch)` ->
`_update(...)`. Ownership: the engine owns every Request it accepted until
the step that reports it finished (or `abort_request`); its KV blocks go back
to the pool in that same call.

The engine core makes token ids, never text: it stops a request on EOS, stop
token ids, max_tokens and min_tokens. Text and stop strings belong to whoever
answers the client (`output_text`: the router, or `engine.llm.LLM` offline),
which aborts a request here when one of its stop strings matched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, parse_dtype
from engine.cpu_features import cpu_features
from engine.kv_connector import KVConnector
from engine.kv_cache_manager import KVCacheManager
from engine.log import configure_logging
from engine.model_runner import ModelRunner, StepRunner
from engine.outputs import CompletionOutput, RequestOutput
from engine.parallel.config import ParallelConfig
from engine.prefill_meter import PrefillMeter, prompt_tokens_advanced
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.structured_output import GrammarCompiler
from engine.tokenizer import eos_token_ids_for, load_tokenizer

logger = logging.getLogger("tandem.engine")
configure_logging()

Prompt = str | list[int] | dict


# A request in this many failed steps ends with the last, alone or not: one that fails only beside others
# (a batch shape, not an input) would otherwise recompute forever.
MAX_FAILED_STEPS_BEFORE_ENDING = 3


class EngineStepError(RuntimeError):
    """A forward step failed; `request_ids` are the requests it ended (blocks freed), those that failed alone.
    The others of the step recompute, each alone, before they rejoin a batch (`LLMEngine._after_failed_step`).
    `attributed`: the step held one suspect alone, so the failure is that request's, not the worker's (a
    worker's failed steps in a row mean a sticky device error only when no request explains them).
    """

    def __init__(self, request_ids: list[str], cause: BaseException, attributed: bool = False):
        super().__init__(f"engine step failed ({type(cause).__name__}: {cause}); ended {request_ids}")
        self.request_ids, self.attributed = request_ids, attributed


@dataclass(frozen=True)
class EngineArgs:
    """User-facing knobs with vLLM's names; `create_engine_config` resolves them."""

    model: str | None = None
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    attention_backend: str = "auto"
    seed: int = 0
    quantization: str = "auto"  # "auto"/"gguf": a GGUF model's blocks; "int8": any linear in Q8_0; "none": widened
    # Tensor parallel: this process is rank `tensor_parallel_rank` of `tensor_parallel_size`;
    # the ranks meet at dist_init_addr ("host:port"); backend "auto" = gloo on CPU, NCCL on CUDA.
    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    dist_init_addr: str = "127.0.0.1:29500"
    dist_backend: str = "auto"

    def create_engine_config(self) -> EngineConfig:
        from engine.model_source import resolve_model

        model_dir = resolve_model(self.model)
        model_cfg = ModelConfig.from_pretrained(model_dir)
        max_len = self.max_model_len or model_cfg.max_position_embeddings
        if max_len > model_cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len {max_len} exceeds the model's max_position_embeddings "
                f"{model_cfg.max_position_embeddings}"
            )
        return EngineConfig(
            model_dir=str(model_dir),
            model=model_cfg,
            cache=CacheConfig(
                block_size=self.block_size,
                num_kv_blocks=self.num_kv_blocks,
                kv_cache_memory=self.kv_cache_memory,
                gpu_memory_utilization=self.gpu_memory_utilization,
                enable_prefix_caching=self.enable_prefix_caching,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=max_len,
            ),
            dtype=self._dtype(),
            device=self.device,
            attention_backend=self.attention_backend,
            seed=self.seed,
            quantization=self.quantization,
            parallel=ParallelConfig(
                tp_size=self.tensor_parallel_size,
                rank=self.tensor_parallel_rank,
                init_addr=self.dist_init_addr,
                backend=self.dist_backend,
            ),
        )

    def _dtype(self):
        dtype = parse_dtype(self.dtype, self.device)
        if self.dtype in (None, "auto") and self.device == "cpu":  # say why: it depends on the machine
            logger.info("dtype auto: %s on %s", str(dtype).removeprefix("torch."), cpu_features().signature())
        return dtype


class LLMEngine:
    def __init__(self, config: EngineConfig, skip_tokenizer_init: bool = False, show_progress: bool = True,
                 runner: StepRunner | None = None,
                 clock: Callable[[], float] = time.perf_counter):  # fmt: skip
        """`runner`: what executes the scheduled steps (default: a `ModelRunner` loading the model; the
        planner's simulator passes one that prices steps instead). `clock`: what step durations are read
        from (the prefill meter's seconds); a simulated runner advances its own."""
        if config.parallel.rank != 0:
            raise ValueError(
                f"LLMEngine runs on tensor-parallel rank 0; rank {config.parallel.rank} runs "
                "engine.parallel.follower.TPFollower"
            )
        self.config = config
        self.tokenizer = None if skip_tokenizer_init else load_tokenizer(config.model_dir)
        self.eos_token_ids = eos_token_ids_for(config.model_dir, config.model, self.tokenizer)
        self.runner = runner if runner is not None else ModelRunner(config, show_progress=show_progress)
        self.clock = clock
        block_size = config.cache.block_size
        self.kv_cache = KVCacheManager(self.runner.num_blocks, block_size, config.cache.enable_prefix_caching)
        # A request must fit the pool on its own, or preemption could never make room for it.
        self.max_model_len = min(config.scheduler.max_model_len, self.runner.num_blocks * block_size)
        self.scheduler = Scheduler(config.scheduler, self.kv_cache)
        self.prefill_meter = PrefillMeter()  # its prompt rate, for the router's TTFT prediction
        # Structured outputs: the vocabulary is read on the first request that asks for one.
        self.grammars = GrammarCompiler(lambda: self.tokenizer or load_tokenizer(config.model_dir),
                                        config.model.vocab_size, self.eos_token_ids)  # fmt: skip
        self.requests: dict[str, Request] = {}
        self._prompts: dict[str, str | None] = {}
        # A worker's seam into the cache (engine.kv_connector), set by the worker built on it: called before
        # each forward and after each layer.
        self.kv_connector: KVConnector | None = None
        sc = config.scheduler
        logger.info(
            "engine ready: %s, %s on %s, max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
            "prefix caching %s",
            config.model.architecture,
            config.dtype,
            config.device,
            self.max_model_len,
            sc.max_num_seqs,
            sc.max_num_batched_tokens,
            "on" if config.cache.enable_prefix_caching else "off",
        )

    @classmethod
    def from_args(cls, args: EngineArgs, **kwargs) -> "LLMEngine":
        return cls(args.create_engine_config(), **kwargs)

    def warm_up(self) -> float:
        """One full step of dummy prompt tokens (the batched-token budget), then nothing of it is kept but the
        prefix cache's blocks of it; returns its seconds. A fresh process's first step at a shape pays
        one-time costs (oneDNN primitives, first-touched pages): measured 766 ms for the first 2048-token
        step against 650 ms for the next, and 0.98 s against 0.7 s inside a serving worker. Serving workers
        call this before they take requests (tensor-parallel ones do not: their followers are not attached
        yet)."""
        start = time.perf_counter()
        tokens = min(self.config.scheduler.max_num_batched_tokens, self.max_model_len - 1)
        self.add_request("warm-up", {"prompt_token_ids": [0] * tokens},
                         SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))  # fmt: skip
        while self.has_unfinished_requests():
            self.step()
        return time.perf_counter() - start

    def shutdown(self) -> None:
        """Tensor parallel: stop the follower ranks' loops and leave the group. A no-op at tp_size 1."""
        self.runner.shutdown()

    # ---- requests -------------------------------------------------------
    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    grammar=None) -> None:  # fmt: skip
        """Validate and queue a request; raises ValueError on bad input, leaving the engine untouched."""
        self.scheduler.add_request(self.new_request(request_id, prompt, params, grammar))

    def new_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    grammar=None) -> Request:  # fmt: skip
        """Validate and register a request without queueing it (engine.remote_kv queues its own).

        `grammar`: `params.structured` compiled, when the caller compiled it (a serving worker does, off its
        loop thread: `runtime.grammar_compiles`); None: taken from `self.grammars`, compiled here if need be."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params.n != 1:
            # One engine request is one sequence; LLM.generate and the router fan n out.
            raise ValueError(f"LLMEngine.add_request takes n=1, got n={params.n}; add n requests instead")
        text, token_ids = self._tokenize(prompt)
        self._validate_tokens(token_ids)
        max_tokens = self._resolve_max_tokens(len(token_ids), params)
        req = Request(request_id, token_ids, params, max_tokens, eos_token_ids=self.eos_token_ids,
                      arrival_time=self.clock())  # fmt: skip
        if params.structured is not None:  # GrammarError (a ValueError): an invalid spec or resumed output
            resumed = token_ids[len(token_ids) - params.resumed_output_tokens :] if params.resumed_output_tokens else []
            req.sampling.grammar = self.grammars.state_for(params.structured, resumed, grammar)
        self.requests[request_id] = req
        self._prompts[request_id] = text
        return req

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free its blocks now. Returns False when it is unknown or already done."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
        self._forget(request_id)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- stepping -------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one forward over the scheduled tokens; return outputs of requests that advanced."""
        started = self.clock()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        advanced = prompt_tokens_advanced(sched)
        for s in sched.scheduled:
            if s.request.first_scheduled_at is None:
                s.request.first_scheduled_at = started
        connector = self.kv_connector
        try:
            attachment = connector.before_forward(sched) if connector is not None else b""
            batch = self.runner.prepare(sched.scheduled)
            sampled = self.runner.execute(batch, attachment, connector.save_layer if connector is not None else None)
        except Exception as err:
            attributed = len(sched.scheduled) == 1 and sched.scheduled[0].request.suspect
            raise EngineStepError(self._after_failed_step(sched), err, attributed) from err
        outputs = self._update(sched, sampled, batch.prompt_spans)
        self.prefill_meter.record(advanced, self.clock() - started)
        return outputs

    def _after_failed_step(self, sched: SchedulerOutput) -> list[str]:
        """The requests of a failed step whose KV cannot be trusted: those that failed alone (or twice, or whose
        KV left with the step: a prefill worker's connector) end and free their blocks; the others recompute,
        each alone, so that the next failure names its cause (`Scheduler.set_aside`). Returns the ended ids."""
        scheduled = [s.request for s in sched.scheduled]
        for req in scheduled:
            req.failed_steps += 1
        isolate = len(scheduled) > 1 and self.kv_connector is None
        ended = [r for r in scheduled if not isolate or r.failed_steps >= MAX_FAILED_STEPS_BEFORE_ENDING]
        for req in scheduled:
            if req in ended:
                self.abort_request(req.request_id)
            else:
                self.scheduler.set_aside(req)
        return [r.request_id for r in ended]

    def _update(self, sched: SchedulerOutput, sampled, prompt_spans=()) -> list[RequestOutput]:
        for span, entries in zip(prompt_spans, sampled.prompt_logprobs):
            sched.scheduled[span.index].request.prompt_logprobs.extend(entries)
        outputs, k = [], 0
        for s in sched.scheduled:
            req, samples = s.request, s.samples
            req.num_computed_tokens += s.num_new_tokens
            self.kv_cache.cache_computed_blocks(req)
            if not samples:
                continue
            token, logprobs = sampled.token_ids[k], sampled.logprobs[k]
            k += 1
            req.suspect = False  # a step of its own sampled: it was not the cause
            outputs.append(self._append_token(req, token, logprobs))
        return outputs

    def _append_token(self, req: Request, token: int, logprobs) -> RequestOutput:
        req.output_token_ids.append(token)
        req.output_logprobs.append(logprobs)
        if len(req.output_token_ids) <= 2:
            now = self.clock()
            if req.first_token_at is None:
                req.first_token_at = now
            else:
                req.second_token_at = now
        status = self._check_stop(req, token)
        if status is not None:
            self.scheduler.finish(req, status)
        out = self._make_output(req, [token])
        if req.is_finished:
            self._forget(req.request_id)
        return out

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        n_out = len(req.output_token_ids)
        stop = req.params.stop_by(token, n_out, req.eos_token_ids)
        if stop is not None:
            req.stop_reason = None if stop == "eos" else stop
            return RequestStatus.FINISHED_STOPPED
        if n_out >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _make_output(self, req: Request, new_token_ids: list[int]) -> RequestOutput:
        completion = CompletionOutput(
            index=0,
            token_ids=list(req.output_token_ids),
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
            logprobs=list(req.output_logprobs) if req.params.logprobs is not None else None,
        )
        wants_prompt = req.params.prompt_logprobs is not None
        prompt_logprobs = [None, *req.prompt_logprobs] if wants_prompt else None
        return RequestOutput(
            request_id=req.request_id,
            prompt=self._prompts.get(req.request_id),
            prompt_token_ids=req.prompt_token_ids,
            outputs=[completion],
            finished=req.is_finished,
            num_cached_tokens=req.num_cached_tokens,
            new_token_ids=new_token_ids,
            prompt_logprobs=prompt_logprobs,
        )

    def _forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self._prompts.pop(request_id, None)

    # ---- validation -----------------------------------------------------
    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs a 'prompt_token_ids' list")
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer; pass prompt_token_ids")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            return None, list(prompt)
        raise ValueError(f"prompt must be a string, a token id list or a dict, got {type(prompt).__name__}")

    def _validate_tokens(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty: it needs at least one token")
        vocab = self.config.model.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, the model's context (max_model_len) is "
                f"{self.max_model_len}: shorten the prompt"
            )

    def _resolve_max_tokens(self, num_prompt: int, params: SamplingParams) -> int:
        room = self.max_model_len - num_prompt
        if params.max_tokens is None:
            return room
        if params.max_tokens > room:
            raise ValueError(
                f"max_tokens={params.max_tokens} plus the prompt's {num_prompt} tokens exceeds "
                f"max_model_len {self.max_model_len}; ask for at most {room}"
            )
        return params.max_tokens
