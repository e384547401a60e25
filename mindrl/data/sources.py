"""Prompt sources: ``synthetic:<task>`` made in code, or a JSONL / parquet file.

Files carry one record per line (JSONL) or row (parquet); ``prompt_key`` and
``answer_key`` name the fields, and ``template`` (``str.format`` over the record's
fields, with ``{prompt}`` always meaning the prompt field) builds the prompt text.
Every error names the file and the line or row that is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mindrl.data.digit_tasks import DEFAULT_TINY_TASK, DIGIT_TASKS, make_digit_task
from mindrl.data.math_tasks import make_math_task
from mindrl.data.records import PromptRecord

SYNTHETIC_PREFIX = "synthetic:"
SYNTHETIC_TASKS = ("tiny", *DIGIT_TASKS, "math")


class PromptSourceError(ValueError):
    """A prompt file or synthetic task name that cannot be read; the message says where."""


def make_synthetic(task: str, num_prompts: int, seed: int) -> list[PromptRecord]:
    """Records of a built-in task: ``tiny`` (= ``tiny-next``), ``tiny-*`` or ``math``."""
    if task == "tiny":
        task = DEFAULT_TINY_TASK
    if task in DIGIT_TASKS:
        return make_digit_task(DIGIT_TASKS[task], num_prompts, seed, name=task)
    if task == "math":
        return make_math_task(num_prompts, seed)
    raise PromptSourceError(f"unknown synthetic task {task!r}; known: {', '.join(SYNTHETIC_TASKS)}")


def load_prompt_records(
    source: str,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    template: str = "{prompt}",
    num_prompts: int = 4096,
    seed: int = 0,
) -> list[PromptRecord]:
    """Records from ``'synthetic:<task>'`` or a ``.jsonl`` / ``.parquet`` file.

    Args:
        source: ``synthetic:<task>`` or a file path.
        prompt_key: Field holding the prompt (files only).
        answer_key: Field holding the ground truth (files only).
        template: ``str.format`` template over the record's fields (files only).
        num_prompts: How many prompts a synthetic task makes.
        seed: Seed of a synthetic task.

    Raises:
        PromptSourceError: missing file, unknown format or task, bad JSON, missing field.
    """
    if source.startswith(SYNTHETIC_PREFIX):
        return make_synthetic(source.removeprefix(SYNTHETIC_PREFIX), num_prompts, seed)
    path = Path(source)
    if not path.is_file():
        raise PromptSourceError(f"prompt file {source!r} does not exist")
    return [
        _record_from_row(f"{path.name}#{number}", where, row, prompt_key, answer_key, template)
        for number, where, row in _read_rows(path)
    ]


def _read_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    raise PromptSourceError(f"prompt file {str(path)!r}: unknown format; use .jsonl or .parquet")


def _jsonl_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise PromptSourceError(f"{where}: bad JSON ({error.msg})") from None
            if not isinstance(row, dict):
                kind = type(row).__name__
                raise PromptSourceError(f"{where}: expected a JSON object, got {kind}")
            yield number, where, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptSourceError(
            f"prompt file {str(path)!r} is parquet but pyarrow is not installed; "
            "pip install pyarrow"
        ) from None
    for number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
        yield number, f"{path} row {number}", row


def _record_from_row(
    uid: str, where: str, row: dict[str, Any], prompt_key: str, answer_key: str, template: str
) -> PromptRecord:
    for key in (prompt_key, answer_key):
        if key not in row:
            raise PromptSourceError(
                f"{where}: no field {key!r} (fields: {', '.join(map(str, row))}); "
                "set data.prompt_key / data.answer_key"
            )
    fields = {**row, "prompt": row[prompt_key]}
    try:
        text = template.format(**fields)
    except KeyError as error:
        raise PromptSourceError(
            f"{where}: template {template!r} names field {error.args[0]!r} the record lacks"
        ) from None
    except (IndexError, ValueError) as error:
        raise PromptSourceError(f"{where}: template {template!r} is malformed ({error})") from None
    return PromptRecord(uid=uid, text=text, answer=str(row[answer_key]))
