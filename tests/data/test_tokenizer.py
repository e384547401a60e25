"""The built-in tiny tokenizer is a real HF fast tokenizer with a small vocabulary."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mindrl.data import build_tiny_tokenizer, load_tokenizer
from mindrl.data.tokenizer import TINY_VOCAB


def test_tiny_tokenizer_is_a_small_hf_fast_tokenizer_with_special_ids():
    tokenizer = build_tiny_tokenizer()
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert len(tokenizer) == len(TINY_VOCAB) < 64
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.unk_token_id == 3


def test_encoding_adds_bos_and_splits_digits_one_per_token():
    tokenizer = build_tiny_tokenizer()
    ids = tokenizer("copy 314 =")["input_ids"]
    expected = [TINY_VOCAB.index(t) for t in ("<s>", "copy", "3", "1", "4", "=")]
    assert ids == expected


def test_decode_round_trips_a_prompt_and_skips_specials_on_request():
    tokenizer = build_tiny_tokenizer()
    text = "reverse 3 1 4 = 4 1 3"
    ids = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(ids) == f"<s> {text} </s>"


def test_unknown_words_become_unk():
    tokenizer = build_tiny_tokenizer()
    assert tokenizer("banana 7", add_special_tokens=False)["input_ids"] == [3, 4 + 7]


def test_saved_tiny_tokenizer_loads_back_from_a_folder(tmp_path):
    build_tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    reference = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    expected = [TINY_VOCAB.index(t) for t in ("<s>", "next", "9", "=")]
    assert loaded("next 9 =")["input_ids"] == reference("next 9 =")["input_ids"] == expected


def test_load_tokenizer_rejects_unknown_builtin_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="builtin:tiny"):
        load_tokenizer("builtin:huge")
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nope"))
