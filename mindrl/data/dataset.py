"""Batches of tokenized prompts with a resumable position.

Each epoch visits the prompts in an order shuffled by ``(seed, epoch)``; a batch is the
next ``batch_size`` prompts of that order, and an epoch's incomplete tail is skipped so
every iteration sees exactly G prompts. ``state_dict()`` holds the epoch and offset:
loading it continues with exactly the batch an uninterrupted run would draw next.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mindrl.data.records import PromptRecord

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ChatTemplateMode = Literal["auto", "always", "never"]


@dataclass(frozen=True)
class PromptBatch:
    """G prompts of one iteration.

    Attributes:
        prompt_ids: Token ids of each prompt (unpadded, G lists).
        ground_truths: Answer string of each prompt.
        uids: Prompt uid of each prompt.
        texts: Prompt text as fed to the tokenizer (chat template applied).
        epoch: Epoch the batch was drawn from.
        offset: Position of the batch's first prompt in that epoch's order.
    """

    prompt_ids: list[list[int]]
    ground_truths: list[str]
    uids: list[str]
    texts: list[str]
    epoch: int
    offset: int

    def __len__(self) -> int:
        return len(self.uids)


def render_prompt(text: str, tokenizer: PreTrainedTokenizerBase, chat: ChatTemplateMode) -> str:
    """The prompt text with the tokenizer's chat template applied when asked or available.

    Raises:
        ValueError: ``chat='always'`` with a tokenizer that has no chat template.
    """
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat == "never" or (chat == "auto" and not has_template):
        return text
    if not has_template:
        raise ValueError("chat template requested but the tokenizer has none; use chat='never'")
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class PromptDataset:
    """Shuffled, resumable batches of tokenized prompts.

    Args:
        records: The prompts.
        tokenizer: Encodes each prompt once, up front.
        batch_size: Prompts per batch (G).
        seed: Seeds the per-epoch shuffle.
        shuffle: False keeps the records' order every epoch.
        max_prompt_length: Longest prompt in tokens; a longer one is an error.
        chat: Chat template use: ``auto`` (when the tokenizer has one), ``always``, ``never``.
        source_name: Where the records come from, for the too-few-prompts message.
    """

    def __init__(
        self,
        records: Sequence[PromptRecord],
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        max_prompt_length: int | None = None,
        chat: ChatTemplateMode = "auto",
        source_name: str = "the source",
    ) -> None:
        if not 1 <= batch_size <= len(records):
            raise ValueError(
                f"data.global_batch_size={batch_size} needs at least that many prompts, "
                f"{source_name} gives {len(records)}; lower data.global_batch_size to at most "
                f"{len(records)} or give more prompts"
            )
        self.records = list(records)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.texts = [render_prompt(r.text, tokenizer, chat) for r in self.records]
        self.prompt_ids: list[list[int]] = tokenizer(self.texts)["input_ids"]
        self._check_lengths(max_prompt_length)
        self.epoch = 0
        self.offset = 0

    def _check_lengths(self, max_prompt_length: int | None) -> None:
        if max_prompt_length is None:
            return
        for record, ids in zip(self.records, self.prompt_ids, strict=True):
            if len(ids) > max_prompt_length:
                raise ValueError(
                    f"prompt {record.uid!r} has {len(ids)} tokens > max_prompt_length "
                    f"{max_prompt_length}; raise rollout.max_prompt_length or shorten it"
                )

    @property
    def batches_per_epoch(self) -> int:
        """Full batches in one epoch (the incomplete tail is skipped)."""
        return len(self.records) // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Record indexes in the order epoch ``epoch`` visits them, shape [num_records]."""
        if not self.shuffle:
            return np.arange(len(self.records))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.records))

    def next_batch(self, count: int | None = None) -> PromptBatch:
        """The next ``count`` prompts (G when None); moves the position forward. Partial
        rollout asks for fewer: only as many as its paused groups left room for."""
        count = self.batch_size if count is None else count
        if self.offset + count > len(self.records):
            self.epoch, self.offset = self.epoch + 1, 0
        chosen = self.epoch_order(self.epoch)[self.offset : self.offset + count]
        batch = PromptBatch(
            prompt_ids=[list(self.prompt_ids[i]) for i in chosen],
            ground_truths=[self.records[i].answer for i in chosen],
            uids=[self.records[i].uid for i in chosen],
            texts=[self.texts[i] for i in chosen],
            epoch=self.epoch,
            offset=self.offset,
        )
        self.offset += count
        return batch

    def __iter__(self) -> Iterator[PromptBatch]:
        """Endless batches, epoch after epoch."""
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Position to checkpoint: epoch, offset and the seed that orders the epochs."""
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpointed position.

        Raises:
            ValueError: a state from a run with another seed (the order would differ).
        """
        if state["seed"] != self.seed:
            raise ValueError(
                f"data state was saved with seed {state['seed']}, this run has {self.seed}; "
                "resume with the same seed"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
