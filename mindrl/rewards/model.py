"""A learned reward model: an HF sequence-classification model with one output.

Used by the reward workers when ``reward.reward_model`` names a folder (config.json,
weights, tokenizer). Its score of ``prompt + response`` is added to the rule-based
verifiers' reward. It runs on the reward workers' CPUs; a reward model too large for
them would need a device worker, which the pipeline does not place yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


class RewardModel:
    """Scores texts with ``AutoModelForSequenceClassification`` (``num_labels=1``).

    Args:
        folder: local HF folder with the model and its tokenizer.
        max_length: longest ``prompt + response`` in tokens (longer texts are cut from
            the left, so the response is always scored).

    Raises:
        ValueError: the folder is missing or its model has more than one output.
    """

    def __init__(self, folder: str | Path, max_length: int = 2048) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not Path(folder).is_dir():
            raise ValueError(f"reward model folder {str(folder)!r} does not exist")
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            folder, local_files_only=True
        ).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"reward model {str(folder)!r} has {self.model.config.num_labels} outputs; "
                "a reward model needs exactly one (num_labels=1)"
            )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.max_length = max_length

    @torch.no_grad()
    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> torch.Tensor:
        """Reward of each ``prompt + response``, float32 ``[batch]``."""
        texts = [p + r for p, r in zip(prompts, responses, strict=True)]
        batch = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.max_length,
        )
        return self.model(**batch).logits[:, 0].float()
