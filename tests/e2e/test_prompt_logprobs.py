"""Prompt logprobs end to end: `echo` with `logprobs` and vLLM's `prompt_logprobs` through the router and
the prefill + decode actors on Ray, equal to transformers' log-softmax of the same prompt; then
lm-evaluation-harness (`local-completions`) scores a small multiple-choice task against the served model
and gets the per-choice loglikelihoods its `hf` model gets on the same weights."""

from __future__ import annotations

import json
import math
import types

import httpx
import pytest
import torch
from transformers import AutoTokenizer

from engine import EngineArgs
from router.config import RouterConfig
from tests.conftest import hf_model
from tests.e2e.router_cluster import router_on_ray
from tests.e2e.test_router_openai import _wait_all_free

MODEL = "tiny-llama"
PROMPTS = [[5, 17, 42, 9, 8, 7, 6, 3], [1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]]


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=64, max_model_len=256, dtype="float32")
    with router_on_ray(ray_session, args, RouterConfig(model_dir, MODEL, max_model_len=256)) as stack:
        yield types.SimpleNamespace(url=stack.server.url, actors=stack.actors, model_dir=model_dir,
                                    tokenizer=AutoTokenizer.from_pretrained(model_dir))  # fmt: skip


def _reference(model_dir: str, prompt: list[int]) -> torch.Tensor:
    """transformers' log-softmax over the prompt: row i scores token i + 1. [len - 1, vocab]"""
    with torch.no_grad():
        logits = hf_model(model_dir)(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def _complete(served, **body) -> dict:
    reply = httpx.post(f"{served.url}/v1/completions", json={"model": MODEL, **body}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_echo_with_logprobs_as_lm_eval_sends_it_matches_transformers(served):
    out = _complete(served, prompt=PROMPTS, max_tokens=1, logprobs=1, echo=True, temperature=0, seed=1234)
    for choice, prompt in zip(sorted(out["choices"], key=lambda c: c["index"]), PROMPTS):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(prompt) + 1 and lp["token_logprobs"][0] is None
        assert choice["text"].startswith(served.tokenizer.decode(prompt))
        ref = _reference(served.model_dir, prompt)
        for i in range(1, len(prompt)):
            assert math.isclose(lp["token_logprobs"][i], ref[i - 1, prompt[i]].item(), abs_tol=1e-4)
            (best,) = lp["top_logprobs"][i].values()  # one alternative: the most likely token
            assert math.isclose(best, ref[i - 1].max().item(), abs_tol=1e-4)
        assert lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0


def test_vllm_prompt_logprobs_carry_token_ids_ranks_and_alternatives(served):
    prompt = PROMPTS[1]
    out = _complete(served, prompt=prompt, max_tokens=2, prompt_logprobs=3, temperature=0)
    entries = out["choices"][0]["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None
    ref = _reference(served.model_dir, prompt)
    for i in range(1, len(prompt)):
        own = entries[i][str(prompt[i])]
        assert math.isclose(own["logprob"], ref[i - 1, prompt[i]].item(), abs_tol=1e-4)
        assert own["rank"] == int((ref[i - 1] > ref[i - 1, prompt[i]]).sum()) + 1
        top3 = ref[i - 1].topk(3).indices.tolist()
        assert set(map(str, top3)) <= set(entries[i]) and len(entries[i]) in (3, 4)
    assert out["choices"][0]["text"] == _complete(served, prompt=prompt, max_tokens=2, temperature=0)["choices"][0]["text"]


def test_streamed_echo_has_the_same_text_and_logprobs(served):
    body = dict(prompt=PROMPTS[0], max_tokens=4, logprobs=2, echo=True, temperature=0)
    whole = _complete(served, **body)["choices"][0]
    text, logprobs = "", []
    with httpx.stream("POST", f"{served.url}/v1/completions", json={"model": MODEL, "stream": True, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                logprobs += choice["logprobs"]["token_logprobs"]
    assert text == whole["text"] and logprobs == whole["logprobs"]["token_logprobs"]
    _wait_all_free(served)


TASK = """task: tandem_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
DOCS = [{"question": "The sky is", "choices": [" blue", " green", " loud"], "answer": 0},
        {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
        {"question": "Paris is in", "choices": [" France", " Peru", " the sea", " July"], "answer": 0}]  # fmt: skip


def _loglikelihoods(model: str, model_args: str, task_dir) -> list[tuple[int, int, float]]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(model=model, model_args=model_args, tasks=["tandem_mc"], log_samples=True,
                              task_manager=TaskManager(include_path=str(task_dir)), batch_size=1)  # fmt: skip
    return sorted((s["doc_id"], i, resp[0]) for s in results["samples"]["tandem_mc"]
                  for i, resp in enumerate(s["filtered_resps"]))  # fmt: skip


def test_lm_eval_harness_scores_the_served_model_as_its_hf_model_does(served, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "tandem_mc.yaml").write_text(TASK.format(data=data))
    served_args = (f"model={MODEL},base_url={served.url}/v1/completions,tokenizer={served.model_dir},"
                   "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1")  # fmt: skip
    ours = _loglikelihoods("local-completions", served_args, tmp_path)
    theirs = _loglikelihoods("hf", f"pretrained={served.model_dir},dtype=float32,device=cpu", tmp_path)
    assert len(ours) == sum(len(d["choices"]) for d in DOCS)
    assert [key[:2] for key in ours] == [key[:2] for key in theirs]
    for (_, _, a), (_, _, b) in zip(ours, theirs):
        assert math.isclose(a, b, abs_tol=1e-3), (ours, theirs)
