"""Offline preference pairs for DPO: ``synthetic:<digit task>`` made in code, or a
JSONL / parquet file with one ``prompt``, ``chosen``, ``rejected`` record per line / row.

The synthetic pairs take the digit task's prompts (``"next 3 1 4 ="``): the chosen
response is the right answer, the rejected one the same answer with one digit changed
to another digit, so a pair differs in exactly one token (the preference is learnable
and its accuracy is a clean signal). Same seed, same pairs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from mindrl.data.digit_tasks import DEFAULT_TINY_TASK, DIGIT_TASKS, make_digit_task
from mindrl.data.sources import SYNTHETIC_PREFIX, PromptSourceError, _read_rows

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
    path = Path(source)
    if not path.is_file():
        raise PromptSourceError(f"preference file {source!r} does not exist")
    pairs = []
    for number, where, row in _read_rows(path):
        missing = [key for key in PAIR_FIELDS if key not in row]
        if missing:
            raise PromptSourceError(
                f"{where}: no field {missing[0]!r} (a pair needs {', '.join(PAIR_FIELDS)}; "
                f"fields: {', '.join(map(str, row))})"
            )
        texts = [str(row[key]) for key in PAIR_FIELDS]
        pairs.append(PreferencePair(f"{path.name}#{number}", *texts))
    return pairs
