"""The router's text agrees with the engine's: same text, cut at the same stop string, on the same token."""

from __future__ import annotations

import random

import pytest

from engine import SamplingParams
from engine.detokenizer import IncrementalDetokenizer
from router.detokenize import TextStream
from tests.tiny_models import _tokenizer

CORPUS = "héllo wörld, 世界 🙂 Paris is the capital of France. def add(a, b):\n    return a + b\n"


def _engine_run(tok, prompt, tokens, **params):
    """Tokens fed until the engine's detokenizer stops; returns (tokens consumed, final text)."""
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(**params))
    for n, token in enumerate(tokens, 1):
        detok.append(token)
        if detok.finished:
            return n, detok.output_text
    detok.flush()
    return len(tokens), detok.output_text


def _router_run(tok, prompt, tokens, stop=(), include_stop=False):
    stream = TextStream(tok, prompt, tuple(stop), include_stop)
    pieces = [stream.add([t]) for t in tokens if not stream.stopped]
    pieces.append(stream.finish())
    return "".join(pieces), stream


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("include_stop", [False, True])
def test_streamed_text_and_stop_match_the_engine(seed, include_stop):
    tok = _tokenizer()
    rng = random.Random(seed)
    ids = tok(CORPUS)["input_ids"]
    # Prompts made from text end on whole characters (a mid-character prompt is the next test's case).
    start = rng.choice([k for k in range(1, len(ids) - 30) if not tok.decode(ids[:k]).endswith("\ufffd")])
    prompt, output = ids[:start], ids[start : start + 30]
    text = tok.decode(output, skip_special_tokens=True)
    cut = rng.randrange(3, len(text) - 3)
    stop = (text[cut : cut + rng.randint(1, 3)], "never-there")
    used, expected = _engine_run(tok, prompt, output, stop=stop, include_stop_str_in_output=include_stop)
    streamed, stream = _router_run(tok, prompt, output[:used], stop, include_stop)
    assert streamed == stream.text == expected
    assert stream.stopped


def test_without_stop_the_text_is_the_full_decode_even_with_a_split_character():
    tok = _tokenizer()
    ids = tok("Paris 世界")["input_ids"]
    streamed, _ = _router_run(tok, ids[:1], ids[1:-1])  # ends inside the multi-byte character
    assert streamed == tok.decode(ids[1:-1])


def test_a_prompt_ending_inside_a_character_never_leaks_into_the_output():
    tok = _tokenizer()
    ids = tok("héllo wörld, 世界")["input_ids"]
    for k in range(1, len(ids) - 1):
        streamed, _ = _router_run(tok, ids[:k], ids[k:])
        assert streamed == tok.decode(ids[k:]), k


def test_text_that_may_start_a_stop_string_is_held_back():
    tok = _tokenizer()
    ids = tok("Paris is the")["input_ids"]
    stream = TextStream(tok, ids[:1], ("is the end",))
    shown = "".join(stream.add([t]) for t in ids[1:])
    assert "is the" not in shown and stream.finish().startswith("is the")
