"""Batches of tokenized prompts with a resumable position.

Each epoch visits the prompts in an order shuffled by ``(seed, epoch)``; a batch is the
next ``batch_size`` prompts of that order, and an epoch's incomplete tail is skipped so
every iteration sees exactly G prompts. ``state_dict()`` holds the epoch and offset:
loading it continues with exactly the batch an uninterrupted run would draw next.

With a mixture (``data.mixture: {DOMAIN: ratio}``) every batch holds each domain's exact
share of prompts (largest remainder: the counts add up to the batch and differ from
``batch x ratio`` by less than one), each domain drawn from an order of its own rows with
an epoch and offset of its own, all of them in the state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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
        records: Each prompt's record (uid, ground truth, domain, the rest of its row).
        texts: Prompt text as fed to the tokenizer (chat template applied).
        epoch: Epoch the batch was drawn from.
        offset: Position of the batch's first prompt in that epoch's order.
    """

    prompt_ids: list[list[int]]
    records: list[PromptRecord]
    texts: list[str]
    epoch: int
    offset: int

    @property
    def uids(self) -> list[str]:
        return [record.uid for record in self.records]

    @property
    def ground_truths(self) -> list[str]:
        return [record.answer for record in self.records]

    def __len__(self) -> int:
        return len(self.records)


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
        mixture: Mapping[str, float] | None = None,
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
        self.mixture = dict(mixture or {})
        #: Mixture: each domain's rows and its position ([epoch, offset]) in its own order.
        self.domain_rows = self._domain_rows(source_name)
        self.domain_positions = {domain: [0, 0] for domain in self.domain_rows}

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
        if self.mixture:
            return self._batch_of(self._mixed(count))
        if self.offset + count > len(self.records):
            self.epoch, self.offset = self.epoch + 1, 0
        chosen = self.epoch_order(self.epoch)[self.offset : self.offset + count]
        batch = self._batch_of(chosen)
        self.offset += count
        return batch

    def _batch_of(self, chosen: np.ndarray) -> PromptBatch:
        return PromptBatch(
            prompt_ids=[list(self.prompt_ids[i]) for i in chosen],
            records=[self.records[i] for i in chosen],
            texts=[self.texts[i] for i in chosen],
            epoch=self.epoch,
            offset=self.offset,
        )

    # ---- a mixture of domains ------------------------------------------------------------
    def _domain_rows(self, source_name: str) -> dict[str, np.ndarray]:
        """Each mixed domain's record indexes.

        Raises:
            ValueError: a domain with a ratio and no rows, rows of a domain without a
                ratio (they would never be drawn), a ratio that is not a positive number,
                or a domain with fewer rows than its prompts per batch.
        """
        if not self.mixture:
            return {}
        domains = np.array([r.domain for r in self.records])
        present = list(dict.fromkeys(domains.tolist()))
        for domain, ratio in self.mixture.items():
            if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio > 0:
                raise ValueError(f"data.mixture.{domain}: a ratio is a number > 0, got {ratio!r}")
            if domain not in present:
                raise ValueError(
                    f"data.mixture gives domain {domain!r} a ratio but {source_name} has no row "
                    f"of it (its domains: {', '.join(present)})"
                )
        unmixed = [d for d in present if d not in self.mixture]
        if unmixed:
            rows = [r.uid for r in self.records if r.domain == unmixed[0]][:3]
            raise ValueError(
                f"{source_name} holds domain {unmixed[0]!r} (rows {', '.join(rows)}) without a "
                f"ratio in data.mixture, so it would never be drawn; give it one or drop its rows"
            )
        rows = {d: np.flatnonzero(domains == d) for d in self.mixture}
        for domain, count in self.mixture_counts(self.batch_size).items():
            if count > len(rows[domain]):
                raise ValueError(
                    f"data.mixture: domain {domain!r} takes {count} prompts of every batch but "
                    f"has {len(rows[domain])} rows; lower its ratio or give it more rows"
                )
        return rows

    def mixture_counts(self, count: int) -> dict[str, int]:
        """Each domain's prompts in a batch of ``count``: ``count x ratio / total`` rounded
        by largest remainder (ties to the domain listed first)."""
        total = sum(self.mixture.values())
        quotas = {d: count * ratio / total for d, ratio in self.mixture.items()}
        counts = {d: int(q) for d, q in quotas.items()}
        by_remainder = sorted(self.mixture, key=lambda d: counts[d] - quotas[d])
        for domain in by_remainder[: count - sum(counts.values())]:
            counts[domain] += 1
        return counts

    def _mixed(self, count: int) -> np.ndarray:
        """The next ``count`` prompts of a mixture: each domain's share, in the order the
        mixture lists the domains."""
        chosen = []
        for index, (domain, take) in enumerate(self.mixture_counts(count).items()):
            rows, position = self.domain_rows[domain], self.domain_positions[domain]
            if position[1] + take > len(rows):
                position[:] = [position[0] + 1, 0]
            order = self._domain_order(index, position[0], len(rows))
            chosen.append(rows[order[position[1] : position[1] + take]])
            position[1] += take
        return np.concatenate(chosen)

    def _domain_order(self, domain_index: int, epoch: int, rows: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(rows)
        return np.random.default_rng([self.seed, epoch, domain_index]).permutation(rows)

    def __iter__(self) -> Iterator[PromptBatch]:
        """Endless batches, epoch after epoch."""
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Position to checkpoint: epoch, offset and the seed that orders the epochs (with
        a mixture, each domain's epoch and offset too)."""
        state: dict[str, Any] = {"epoch": self.epoch, "offset": self.offset, "seed": self.seed}
        if self.mixture:
            state["domains"] = {d: list(p) for d, p in self.domain_positions.items()}
        return state

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
        saved = state.get("domains", {})
        if self.mixture and set(saved) != set(self.mixture):
            raise ValueError(
                f"data state was saved with mixture domains {sorted(saved) or 'none'}, this "
                f"run mixes {sorted(self.mixture)}; resume with the same data.mixture"
            )
        for domain, (epoch, offset) in saved.items():
            self.domain_positions[domain] = [int(epoch), int(offset)]
