"""The router's text of a choice, without workers: token chunks in, text, tokens sent and finish reasons out.

The router alone decides stop strings, on the whole output: across two chunks, across a resume (the
token stream's seam), and on the token that ends the worker's part too; a choice it stops is aborted
on its workers and bills the tokens it sent.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from output_text import TextOptions, TextStream
from router.choice_output import ChoiceOutput
from router.metrics import RouterMetrics
from router.policy import make_policy
from router.registry import WorkerRegistry
from router.serving import Admission, RequestRunner, RunningRequest, _Choice
from router.token_stream import OutputChunk, RequestOutputs
from tests.output_text import tokenizers
from wire.requests import GenerateRequest, SamplingSpec, TokenDelta, TokenLogprob

STOP = TextOptions(stop=("STOP",))


@pytest.fixture(scope="module")
def chars():
    return tokenizers.chars()


def _choice(tok, prompt: str, options: TextOptions = STOP) -> ChoiceOutput:
    ids = tok.encode(prompt)
    request = GenerateRequest("r", tuple(ids), SamplingSpec(), "tcp://127.0.0.1:1")
    return ChoiceOutput(0, request, TextStream(tok, ids, options))


def _logprobs(ids) -> list[TokenLogprob]:
    return [TokenLogprob(-float(t)) for t in ids]


def test_a_stop_string_straddling_two_chunks_ends_the_choice_at_the_token_that_completed_it(chars):
    choice, first, second = _choice(chars, "Q:"), chars.encode("abST"), chars.encode("OPxyz")
    shown = choice.update(OutputChunk(first, _logprobs(first)))
    assert (shown.text, shown.token_ids, shown.final) == ("ab", first, None)  # "ST" held back
    last = choice.update(OutputChunk(second, _logprobs(second), num_cached_tokens=1))
    assert last.text == "" and last.token_ids == second[:2] and last.logprobs == _logprobs(second[:2])
    final = last.final
    assert (final.finish_reason, final.num_output_tokens, final.num_prompt_tokens, final.num_cached_tokens) == (
        "stop", 6, 2, 1)  # fmt: skip


def test_a_stop_string_straddling_a_resume_is_like_any_other(chars):
    """Attempt 1 sends "abcST" and dies; attempt 2 (a new request id, numbering from 0) sends "OPxyz"."""
    prompt = chars.encode("Q:")
    choice, ids = _choice(chars, "Q:"), chars.encode("abcSTOPxyz")

    async def main():
        outputs = RequestOutputs()
        chunks = outputs.chunks()
        outputs.put(TokenDelta("r", 0, tuple(ids[:1])))  # prefill's first token
        outputs.put(TokenDelta("r", 1, tuple(ids[1:5]), num_prompt_tokens=2, num_output_tokens=5))
        updates = [choice.update(await anext(chunks))]  # both deltas, in one chunk
        assert outputs.restart() == 5  # the dispatcher resumes: prompt + 5 tokens, on other workers
        resumed = len(prompt) + 5
        outputs.put(TokenDelta("r.1", 0, tuple(ids[5:]), num_prompt_tokens=resumed, num_output_tokens=5,
                               num_cached_tokens=resumed))  # fmt: skip
        return updates + [choice.update(await anext(chunks))]

    updates = asyncio.run(main())
    assert "".join(u.text for u in updates) == "abc"
    assert [t for u in updates for t in u.token_ids] == ids[:7]  # nothing after "P" is sent
    final = updates[-1].final
    assert (final.finish_reason, final.num_output_tokens, final.num_prompt_tokens) == ("stop", 7, 2)
    assert final.num_cached_tokens == 2  # the resumed prompt's cache hits, as the whole request's prompt


def test_a_choice_its_worker_ends_shows_its_held_back_text_and_keeps_the_worker_s_reason(chars):
    choice, ids = _choice(chars, "Q:"), chars.encode("abST")
    worker_final = TokenDelta("r", 4, (), True, "length", 2, 4)
    update = choice.update(OutputChunk(ids, final=worker_final))
    assert update.text == "abST" and update.final is worker_final and update.token_ids == ids


def test_a_stop_string_on_the_worker_s_last_token_is_a_stop(chars):
    choice, ids = _choice(chars, "Q:"), chars.encode("aSTOP")
    update = choice.update(OutputChunk(ids, final=TokenDelta("r", 5, (), True, "length", 2, 5)))
    assert (update.text, update.finish_reason, update.final.num_output_tokens) == ("a", "stop", 5)


def test_include_stop_str_and_min_tokens_apply_to_the_whole_output(chars):
    options = TextOptions(stop=("S",), include_stop_str_in_output=True, min_tokens=3)
    choice, ids = _choice(chars, "Q:", options), chars.encode("SSxSy")
    updates = [choice.update(OutputChunk(ids[:2])), choice.update(OutputChunk(ids[2:]))]
    assert "".join(u.text for u in updates) == "SSxS" and updates[-1].final.num_output_tokens == 4


class _Generation:
    """What `RunningRequest` reads of a dispatched sequence: its chunks, and `close()` (aborts if unfinished)."""

    def __init__(self, chunks: list[OutputChunk]):
        self._chunks, self.finished, self.closed = chunks, False, 0
        self.prompt_phases = None  # decode prefilled it

    async def chunks(self):
        for chunk in self._chunks:
            self.finished = chunk.final is not None
            yield chunk

    def close(self):
        self.closed += 1


def _running(tok, generation: _Generation) -> RunningRequest:
    metrics = RouterMetrics(WorkerRegistry(make_policy("round_robin")))
    runner = RequestRunner(None, None, Admission(1, 1), metrics)
    runner.admission.admit(1)
    return RunningRequest([_Choice(0, generation, _choice(tok, "Q:"))], [2], time.monotonic(), runner)


async def _collect(running: RunningRequest) -> list:
    return [u async for u in running.updates()]


def test_the_router_aborts_a_choice_it_stopped_on_its_workers_and_bills_what_it_sent(chars):
    ids = chars.encode("abSTOPxyz")
    generation = _Generation([OutputChunk(ids[:3]), OutputChunk(ids[3:])])  # the workers would go on
    running = _running(chars, generation)
    updates = asyncio.run(_collect(running))
    assert generation.closed == 1  # aborted as soon as the stop string matched
    assert "".join(u.text for u in updates) == "ab" and updates[-1].finish_reason == "stop"
    assert running.usage() == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}
    running.close()
    finished = running.runner.metrics.registry.get_sample_value
    assert finished("tandem:request_success_total", {"finished_reason": "stop"}) == 1
    assert finished("tandem:request_success_total", {"finished_reason": "abort"}) is None


def test_a_choice_its_worker_finished_is_not_aborted(chars):
    ids = chars.encode("abc")
    generation = _Generation([OutputChunk(ids, final=TokenDelta("r", 3, (), True, "length", 2, 3))])
    running = _running(chars, generation)
    updates = asyncio.run(_collect(running))
    assert generation.closed == 0 and updates[-1].finish_reason == "length"
    assert running.usage()["completion_tokens"] == 3
