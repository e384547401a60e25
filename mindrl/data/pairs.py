"""Offline preference pairs for DPO: ``synthetic:<digit task>`` made in code, or a
JSONL / parquet file with one ``prompt``, ``chosen``, ``rejected`` record per line / row.

The synthetic pairs take the digit task's prompts (``"next 3 1 4 ="``): the chosen
response is the right answer, the rejected one the same answer with one digit changed
to another digit, so a pair differs in exactly one token (the preference is learnable
and its accuracy is a clean signal). Same seed, same pairs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mindrl.config.schema import MindRLConfig
from mindrl.data.dataset import ChatTemplateMode, PromptDataset
from mindrl.data.digit_tasks import DEFAULT_TINY_TASK, DIGIT_TASKS, make_digit_task
from mindrl.data.records import PromptRecord
from mindrl.data.sources import SYNTHETIC_PREFIX, PromptSourceError, checked_file, read_rows

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    """One prompt with a preferred and a dispreferred response (texts, no template)."""

    uid: str
    prompt: str
    chosen: str
    rejected: str


def make_digit_pairs(task: str, num_pairs: int, seed: int) -> list[PreferencePair]:
    """``num_pairs`` pairs of the digit task ``task`` (``tiny`` = ``tiny-next``).

    Raises:
        PromptSourceError: ``task`` is not a digit task.
    """
    task = DEFAULT_TINY_TASK if task == "tiny" else task
    if task not in DIGIT_TASKS:
        known = ", ".join(["tiny", *DIGIT_TASKS])
        raise PromptSourceError(f"no preference pairs for task {task!r}; known: {known}")
    rng = random.Random(f"pairs:{task}:{seed}")
    pairs = []
    for record in make_digit_task(DIGIT_TASKS[task], num_pairs, seed, name=task):
        digits = record.answer.split()
        position = rng.randrange(len(digits))
        # A different digit at one position: randrange(1, 10) never maps back to itself.
        wrong = (int(digits[position]) + rng.randrange(1, 10)) % 10
        rejected = [*digits[:position], str(wrong), *digits[position + 1 :]]
        pairs.append(PreferencePair(record.uid, record.text, record.answer, " ".join(rejected)))
    return pairs


def load_preference_pairs(
    source: str, num_pairs: int = 4096, seed: int = 0
) -> list[PreferencePair]:
    """Pairs from ``'synthetic:<digit task>'`` or a ``.jsonl`` / ``.parquet`` file.

    Raises:
        PromptSourceError: a missing file, an unknown format or task, bad JSON, or a
            record without one of ``prompt``, ``chosen``, ``rejected`` (named with its
            line or row).
    """
    if source.startswith(SYNTHETIC_PREFIX):
        return make_digit_pairs(source.removeprefix(SYNTHETIC_PREFIX), num_pairs, seed)
    path = checked_file(source, "preference file")
    pairs = []
    for number, where, row in read_rows(path):
        missing = [key for key in PAIR_FIELDS if key not in row]
        if missing:
            raise PromptSourceError(
                f"{where}: no field {missing[0]!r} (a pair needs {', '.join(PAIR_FIELDS)}; "
                f"fields: {', '.join(map(str, row))})"
            )
        texts = [row[key] for key in PAIR_FIELDS]
        wrong = [
            key for key, text in zip(PAIR_FIELDS, texts, strict=True) if not isinstance(text, str)
        ]
        if wrong:
            kind = type(row[wrong[0]]).__name__
            raise PromptSourceError(
                f"{where}: field {wrong[0]!r} is a {kind}; a pair's prompt, chosen and rejected "
                "are plain texts (chat messages are not supported)"
            )
        pairs.append(PreferencePair(f"{path.name}#{number}", *texts))
    if not pairs:
        raise PromptSourceError(
            f"preference file {source!r} holds no pairs (it is empty or blank); give one JSON "
            "object per line with fields prompt, chosen and rejected"
        )
    return pairs


@dataclass(frozen=True)
class PairBatch:
    """G pairs of one iteration, token ids unpadded: the prompt (chat template and the
    tokenizer's special tokens applied) and each response followed by the eos token."""

    prompt_ids: list[list[int]]
    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    uids: list[str]


class PairDataset(PromptDataset):
    """Shuffled, resumable batches of tokenized preference pairs.

    The epoch order, position and prompt checks are :class:`PromptDataset`'s (over the
    pairs' prompts), so a resumed DPO run draws the same pairs as an uninterrupted one.
    A response ends with the eos token, as a generated one does.

    Raises:
        ValueError: a prompt or a response longer than its limit, or too few pairs.
    """

    def __init__(
        self,
        pairs: Sequence[PreferencePair],
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        max_prompt_length: int | None = None,
        max_response_length: int | None = None,
        chat: ChatTemplateMode = "auto",
        source_name: str = "the source",
    ) -> None:
        records = [PromptRecord(p.uid, p.prompt, p.chosen) for p in pairs]
        super().__init__(
            records, tokenizer, batch_size, seed, shuffle, max_prompt_length, chat, source_name
        )
        self.pairs = list(pairs)
        self._index = {pair.uid: i for i, pair in enumerate(self.pairs)}
        self.chosen_ids = self._responses([p.chosen for p in pairs], tokenizer)
        self.rejected_ids = self._responses([p.rejected for p in pairs], tokenizer)
        for i, pair in enumerate(self.pairs):
            longest = max(len(self.chosen_ids[i]), len(self.rejected_ids[i]))
            if max_response_length is not None and longest > max_response_length:
                raise ValueError(
                    f"pair {pair.uid!r} has a response of {longest} tokens (eos included) > "
                    f"max_response_length {max_response_length}; raise "
                    "rollout.max_response_length or shorten it"
                )

    @staticmethod
    def _responses(texts: list[str], tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
        # No special tokens: a response continues its prompt, so no second bos.
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [[*row, tokenizer.eos_token_id] for row in ids]

    def next_pairs(self) -> PairBatch:
        """The next G pairs; moves the position forward (as ``next_batch``)."""
        batch = self.next_batch()
        chosen = [self._index[uid] for uid in batch.uids]
        return PairBatch(
            prompt_ids=batch.prompt_ids,
            chosen_ids=[list(self.chosen_ids[i]) for i in chosen],
            rejected_ids=[list(self.rejected_ids[i]) for i in chosen],
            uids=batch.uids,
        )


def pair_dataset(config: MindRLConfig, tokenizer: PreTrainedTokenizerBase) -> PairDataset:
    """The run's batches of G pairs from ``data.source`` (a synthetic task makes
    ``data.num_prompts`` of them with the run's seed), limited by the rollout lengths.

    Raises:
        ValueError: an unreadable source (:class:`PromptSourceError`), a pair too long,
            or fewer pairs than ``data.global_batch_size``.
    """
    data = config.data
    return PairDataset(
        load_preference_pairs(data.source, data.num_prompts, config.seed),
        tokenizer,
        batch_size=data.global_batch_size,
        seed=config.seed,
        shuffle=data.shuffle,
        max_prompt_length=config.rollout.max_prompt_length,
        max_response_length=config.rollout.max_response_length,
        chat=data.chat_template,
        source_name=f"data.source {data.source!r}",
    )
