"""The learned reward model scores prompt + response with an HF classifier (one output)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from mindrl.data import build_tiny_tokenizer
from mindrl.rewards.model import RewardModel


def save_tiny_reward_model(folder, num_labels: int = 1) -> LlamaForSequenceClassification:
    """A 1-layer Llama classifier with the built-in tiny tokenizer, saved to ``folder``."""
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def test_scores_equal_the_classifier_output_on_the_joined_text(tmp_path):
    model = save_tiny_reward_model(tmp_path)
    reward_model = RewardModel(tmp_path)
    scores = reward_model.score(["next 3 =", "copy 1 2 ="], ["4", "1 2"])

    tokenizer = build_tiny_tokenizer()
    for i, text in enumerate(["next 3 =4", "copy 1 2 =1 2"]):
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            expected = model(**ids).logits[0, 0]
        assert scores[i].item() == pytest.approx(expected.item(), abs=1e-5)
    assert scores.dtype == torch.float32 and scores.shape == (2,)


def test_a_classifier_with_more_than_one_output_is_refused(tmp_path):
    save_tiny_reward_model(tmp_path, num_labels=2)
    with pytest.raises(ValueError, match="exactly one"):
        RewardModel(tmp_path)


def test_a_missing_folder_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        RewardModel(tmp_path / "nope")
