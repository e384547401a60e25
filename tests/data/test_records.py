"""A prompt's record as the dock carries it: every field survives the trip as UTF-8 bytes."""

from __future__ import annotations

import torch

from mindrl.data.records import RECORD_FIELDS, PromptRecord, record_fields, records_from_fields


def as_fetched(fields: dict[str, list]) -> dict[str, torch.Tensor]:
    """Byte rows padded to the longest with their lengths, the form a dock fetch returns."""
    out = {}
    for name, rows in fields.items():
        width = max(len(row) for row in rows)
        padded = torch.zeros(len(rows), width, dtype=torch.uint8)
        for i, row in enumerate(rows):
            padded[i, : len(row)] = torch.as_tensor(row)
        out[name], out[f"{name}_lengths"] = padded, torch.tensor([len(r) for r in rows])
    return out


def test_a_record_comes_back_from_its_dock_fields_as_it_was_put():
    records = [
        PromptRecord("data.jsonl#1", "Q: déjà vu? 漢字", "42", "déjà vu? 漢字", "math", {"k": [1]}),
        PromptRecord("tiny-0", "next : 3 =", "4"),
    ]
    fields = record_fields(records)
    assert tuple(fields) == RECORD_FIELDS
    assert records_from_fields(as_fetched(fields)) == records


def test_a_record_without_a_template_has_its_text_as_its_prompt():
    record = PromptRecord("u", "next : 3 =", "4")
    assert (record.prompt, record.domain, record.meta) == ("next : 3 =", "default", {})
