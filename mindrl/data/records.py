"""The unit every prompt source produces: one prompt with its ground truth, its domain
and the rest of its data row; and that record as the dock carries it.

The driver puts a prompt's record beside its token ids, once per group, and every stage
that needs it (the reward functions, an environment's ``reset``) fetches it from the
dock: no worker reads the dataset again (docs/architecture.md §3).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The domain of a row whose data names none (``data.domain_key`` absent from the row).
DEFAULT_DOMAIN = "default"

#: The record's dock fields, each a UTF-8 byte string per sample (``meta`` as JSON).
UID, TEXT, PROMPT, ANSWER, DOMAIN, META = "uid", "text", "prompt", "answer", "domain", "meta"
RECORD_FIELDS = (UID, TEXT, PROMPT, ANSWER, DOMAIN, META)


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset.

    Attributes:
        uid: Stable identity of the prompt (groups the n responses of GRPO by it).
        text: Prompt text after ``data.template``, before any chat template.
        answer: Ground truth handed to the rewards, as a string.
        prompt: The row's prompt field before any template (default: ``text``).
        domain: What kind of task the row is (routes it to its rewards).
        meta: Every other field of the data row (a code task's tests, a rubric, ...).
    """

    uid: str
    text: str
    answer: str
    prompt: str | None = None
    domain: str = DEFAULT_DOMAIN
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.prompt is None:  # no template: the prompt is the text
            object.__setattr__(self, "prompt", self.text)


def record_fields(records: Sequence[PromptRecord]) -> dict[str, list[np.ndarray]]:
    """The dock fields of ``records``: one UTF-8 byte row per record and field."""
    columns: dict[str, list[str]] = {
        UID: [r.uid for r in records],
        TEXT: [r.text for r in records],
        PROMPT: [r.prompt for r in records],
        ANSWER: [r.answer for r in records],
        DOMAIN: [r.domain for r in records],
        # default=str: a parquet row may hold dates or decimals, which JSON cannot spell.
        META: [json.dumps(dict(r.meta), default=str, ensure_ascii=False) for r in records],
    }
    return {name: [_utf8(text) for text in texts] for name, texts in columns.items()}


def texts_of(data: Mapping[str, Any], name: str) -> list[str]:
    """The UTF-8 strings of byte field ``name`` as fetched from the dock (padded rows with
    a ``<name>_lengths`` column), one per sample."""
    rows, lengths = data[name], data[f"{name}_lengths"]
    return [bytes(row[:n].tolist()).decode() for row, n in zip(rows, lengths.tolist(), strict=True)]


def records_from_fields(data: Mapping[str, Any]) -> list[PromptRecord]:
    """The records of the fetched samples, as the driver put them (:func:`record_fields`)."""
    uids, texts, prompts, answers, domains, metas = (texts_of(data, f) for f in RECORD_FIELDS)
    return [
        PromptRecord(uid, text, answer, prompt, domain, json.loads(meta))
        for uid, text, prompt, answer, domain, meta in zip(
            uids, texts, prompts, answers, domains, metas, strict=True
        )
    ]


def _utf8(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)
