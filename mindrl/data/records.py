"""The unit every prompt source produces: one prompt with its ground truth."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset.

    Attributes:
        uid: Stable identity of the prompt (groups the n responses of GRPO by it).
        text: Prompt text after the template, before any chat template.
        answer: Ground truth handed to the verifiers, as a string.
    """

    uid: str
    text: str
    answer: str
