"""The prompts of a run, from its config: the one recipe the driver, the reward workers
and the TRL benchmark share, so they all see the same records in the same order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindrl.config.schema import MindRLConfig
from mindrl.data.dataset import PromptDataset
from mindrl.data.records import PromptRecord
from mindrl.data.sources import load_prompt_records

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def prompt_records(config: MindRLConfig) -> list[PromptRecord]:
    """The run's prompt records (``data`` section, seeded by the run's seed)."""
    data = config.data
    return load_prompt_records(
        data.source,
        prompt_key=data.prompt_key,
        answer_key=data.answer_key,
        template=data.template,
        num_prompts=data.num_prompts,
        seed=config.seed,
    )


def prompt_dataset(config: MindRLConfig, tokenizer: PreTrainedTokenizerBase) -> PromptDataset:
    """The run's batches of G tokenized prompts, shuffled and templated as configured.

    Raises:
        ValueError: a prompt longer than ``rollout.max_prompt_length``, too few prompts
            for the batch, or an unreadable source.
    """
    return PromptDataset(
        prompt_records(config),
        tokenizer,
        batch_size=config.data.global_batch_size,
        seed=config.seed,
        shuffle=config.data.shuffle,
        max_prompt_length=config.rollout.max_prompt_length,
        chat=config.data.chat_template,
    )
