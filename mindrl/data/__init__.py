"""Prompts for RL: tokenizers, synthetic verifiable tasks, file sources, resumable batches."""

from mindrl.data.dataset import PromptBatch, PromptDataset, render_prompt
from mindrl.data.digit_tasks import DEFAULT_TINY_TASK, DIGIT_TASKS, DigitTaskSpec
from mindrl.data.records import PromptRecord
from mindrl.data.sources import (
    SYNTHETIC_TASKS,
    PromptSourceError,
    load_prompt_records,
    make_synthetic,
)
from mindrl.data.tokenizer import build_tiny_tokenizer, load_tokenizer

__all__ = [
    "DEFAULT_TINY_TASK",
    "DIGIT_TASKS",
    "SYNTHETIC_TASKS",
    "DigitTaskSpec",
    "PromptBatch",
    "PromptDataset",
    "PromptRecord",
    "PromptSourceError",
    "build_tiny_tokenizer",
    "load_prompt_records",
    "load_tokenizer",
    "make_synthetic",
    "render_prompt",
]
