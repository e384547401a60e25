"""Verifier registry and batch scoring into a float32 reward tensor."""

from __future__ import annotations

import pytest
import torch

from mindrl.data import build_tiny_tokenizer
from mindrl.rewards import VERIFIERS, decode_responses, get_verifier, score_batch


def test_unknown_verifier_lists_the_known_ones():
    with pytest.raises(KeyError, match="known: exact, math, math_format, synthetic"):
        get_verifier("llm_judge")


def test_text_batch_scores_into_float32_tensor():
    rewards = score_batch(["3 1", "3 2", "9"], ["3 1", "3 1", "3 1"])
    assert rewards.dtype == torch.float32
    assert torch.equal(rewards, torch.tensor([1.0, 0.5, 0.0]))


def test_verifiers_are_summed_with_weights():
    rewards = score_batch(
        ["41", "\\boxed{42}", "??"],
        ["42"] * 3,
        verifiers=("math", "math_format"),
        weights={"math_format": 0.1},
    )
    assert torch.allclose(rewards, torch.tensor([0.1, 1.1, 0.0]))


def test_token_id_responses_are_cut_at_eos_and_out_of_vocab_ids_count_as_wrong():
    tokenizer = build_tiny_tokenizer()
    digit = {str(d): tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)}
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    responses = [
        [digit["3"], digit["1"], eos, pad, pad],
        [digit["3"], 60, eos],  # 60: a padded-vocabulary id the tokenizer lacks
        [digit["3"], digit["1"], digit["1"]],  # ran out of length without eos
        [digit["3"], digit["1"], pad, pad],  # generated pads are not padding
    ]
    texts = decode_responses(responses, tokenizer)
    assert texts == ["3 1", "3 <unk>", "3 1 1", "3 1 <pad> <pad>"]
    rewards = score_batch(responses, ["3 1"] * 4, tokenizer=tokenizer)
    assert torch.allclose(rewards, torch.tensor([1.0, 0.5, 2 / 3, 0.5]))


def test_batch_errors_are_clear():
    with pytest.raises(ValueError, match="2 responses but 1 ground truths"):
        score_batch(["1", "2"], ["1"])
    with pytest.raises(ValueError, match="pass the tokenizer"):
        score_batch([[4, 5]], ["1"])
    assert set(VERIFIERS) >= {"synthetic", "exact", "math", "math_format"}
