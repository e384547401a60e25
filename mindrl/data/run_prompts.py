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
    return _records(config, config.data.source, config.data.num_prompts, config.seed)


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
        source_name=f"data.source {config.data.source!r}",
        mixture=config.data.mixture,
    )


#: A synthetic validation source is made with the run's seed plus this, so it is another
#: draw of the task than the training prompts (a small task such as tiny-next has few
#: distinct prompts, so the two overlap: its validation measures the policy, not transfer).
VALIDATION_SEED_OFFSET = 1


def validation_records(config: MindRLConfig) -> list[PromptRecord]:
    """The held-out prompts of ``data.val_source`` (a synthetic task makes
    ``data.val_num_prompts`` of them; a file gives all its records).

    Raises:
        PromptSourceError: an unreadable source (no source: the config check refuses it).
    """
    data = config.data
    assert data.val_source is not None, "validation without data.val_source"
    return _records(
        config, data.val_source, data.val_num_prompts, config.seed + VALIDATION_SEED_OFFSET
    )


def _records(
    config: MindRLConfig, source: str | list[str], num_prompts: int, seed: int
) -> list[PromptRecord]:
    """``source``'s records (a list of sources: theirs, one after the other), read with
    the ``data`` section's keys and template."""
    data = config.data
    return [
        record
        for one in ([source] if isinstance(source, str) else source)
        for record in load_prompt_records(
            one,
            prompt_key=data.prompt_key,
            answer_key=data.answer_key,
            template=data.template,
            num_prompts=num_prompts,
            seed=seed,
            domain_key=data.domain_key,
        )
    ]
