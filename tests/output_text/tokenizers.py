"""Small fast tokenizers built in-process (offline), each shaped for one kind of text case."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def _byte_level(corpus: list[str], vocab_size: int, special: list[str]) -> Tokenizer:
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, initial_alphabet=alphabet,
                                  show_progress=False)  # fmt: skip
    tk.train_from_iterator(corpus * 3, trainer)
    return tk


def bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE: merges whole words, and splits non-ASCII characters into bytes."""
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, hello there. The end.", "héllo 世界 🙂"]
    tk = _byte_level(corpus, 300, ["<eos>", "<sep>"])
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", additional_special_tokens=["<sep>"])


def chars() -> PreTrainedTokenizerFast:
    """A byte-level BPE with no merges: one token per ASCII character, so each step's text is exact."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    return PreTrainedTokenizerFast(tokenizer_object=_byte_level(["x"], len(alphabet) + 1, ["<eos>"]),
                                   eos_token="<eos>")  # fmt: skip


def words(*vocab: str) -> PreTrainedTokenizerFast:
    """Token i is vocab[i], text joined as is: stop strings inside one token's text, or across two."""
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate((*vocab, "[UNK]"))}, unk_token="[UNK]"))
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk)
