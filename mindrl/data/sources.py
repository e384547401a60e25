"""Prompt sources: ``synthetic:<task>`` made in code, or a JSONL / parquet file.

Files carry one record per line (JSONL) or row (parquet); ``prompt_key`` and
``answer_key`` name the fields, and ``template`` (``str.format`` over the record's
fields, with ``{prompt}`` always meaning the prompt field) builds the prompt text.
Every error names the file and the line or row that is wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindrl.data.code_tasks import make_code_task
from mindrl.data.digit_tasks import DEFAULT_TINY_TASK, DIGIT_TASKS, make_digit_task
from mindrl.data.math_tasks import make_math_task
from mindrl.data.records import DEFAULT_DOMAIN, PromptRecord

SYNTHETIC_PREFIX = "synthetic:"
SYNTHETIC_TASKS = ("tiny", *DIGIT_TASKS, "math", "code")


class PromptSourceError(ValueError):
    """A prompt file or synthetic task name that cannot be read; the message says where."""


def make_synthetic(task: str, num_prompts: int, seed: int) -> list[PromptRecord]:
    """Records of a built-in task: ``tiny`` (= ``tiny-next``), ``tiny-*``, ``math`` (word
    problems, domain ``math``) or ``code`` (function tasks with tests, domain ``code``)."""
    if task == "tiny":
        task = DEFAULT_TINY_TASK
    if task in DIGIT_TASKS:
        return make_digit_task(DIGIT_TASKS[task], num_prompts, seed, name=task)
    if task == "math":
        return make_math_task(num_prompts, seed)
    if task == "code":
        return make_code_task(num_prompts, seed)
    raise PromptSourceError(f"unknown synthetic task {task!r}; known: {', '.join(SYNTHETIC_TASKS)}")


def load_prompt_records(
    source: str,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    template: str = "{prompt}",
    num_prompts: int = 4096,
    seed: int = 0,
    domain_key: str = "domain",
) -> list[PromptRecord]:
    """Records from ``'synthetic:<task>'`` or a ``.jsonl`` / ``.parquet`` file.

    Args:
        source: ``synthetic:<task>`` or a file path.
        prompt_key: Field holding the prompt (files only).
        answer_key: Field holding the ground truth (files only).
        template: ``str.format`` template over the record's fields (files only).
        num_prompts: How many prompts a synthetic task makes.
        seed: Seed of a synthetic task.
        domain_key: Field naming the row's domain (files only; a row without it, or with
            null there, is domain ``default``). The row's other fields become its ``meta``.

    Raises:
        PromptSourceError: missing file, unknown format or task, bad JSON, missing field.
    """
    if source.startswith(SYNTHETIC_PREFIX):
        return make_synthetic(source.removeprefix(SYNTHETIC_PREFIX), num_prompts, seed)
    path = checked_file(source, "prompt file")
    keys = RowKeys(prompt_key, answer_key, domain_key)
    records = [
        _record_from_row(f"{path.name}#{number}", where, row, keys, template)
        for number, where, row in read_rows(path)
    ]
    if not records:
        raise PromptSourceError(
            f"prompt file {source!r} holds no prompts (it is empty or blank); give one JSON "
            f"object per line with fields {prompt_key!r} and {answer_key!r}"
        )
    return records


def checked_file(source: str, what: str) -> Path:
    """``source`` as a path to a readable file, or one line saying what it is instead.

    Raises:
        PromptSourceError: no such file, a folder, or a file this process cannot read.
    """
    path = Path(source)
    if path.is_dir():
        raise PromptSourceError(f"{what} {source!r} is a folder; name a .jsonl or .parquet file")
    if not path.is_file():
        raise PromptSourceError(f"{what} {source!r} does not exist")
    if not os.access(path, os.R_OK):
        raise PromptSourceError(f"{what} {source!r} is not readable by this user; check its mode")
    return path


def read_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line or row number, where, record)`` for each record of a JSONL / parquet file;
    ``where`` names the file and the line or row for error messages.

    Raises:
        PromptSourceError: an unknown suffix, a line that is not UTF-8 or not a JSON
            object, a file that is not parquet.
    """
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    hint = ""
    if path.suffix == ".json":
        hint = "; if it holds one JSON object per line, rename it .jsonl"
    raise PromptSourceError(
        f"prompt file {str(path)!r}: unknown format {path.suffix or '(no suffix)'!r}; "
        f"use .jsonl or .parquet{hint}"
    )


def _jsonl_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    # Read bytes and decode line by line: a text-mode read fails somewhere inside its
    # buffer with a message that names neither the file nor the line.
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            line = _decoded(raw, where, first=number == 1)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                hint = (
                    " (the file looks like one JSON array; JSON Lines holds one object per line)"
                    if number == 1 and line.lstrip().startswith("[")
                    else ""
                )
                raise PromptSourceError(
                    f"{where}: bad JSON ({error.msg} at column {error.colno}){hint}"
                ) from None
            if not isinstance(row, dict):
                kind = type(row).__name__
                raise PromptSourceError(f"{where}: expected a JSON object, got {kind}")
            yield number, where, row


def _decoded(raw: bytes, where: str, first: bool) -> str:
    """One line of a JSONL file as text (a UTF-8 byte-order mark on the first is dropped)."""
    if b"\0" in raw:
        raise PromptSourceError(
            f"{where}: holds NUL bytes, so it is not a text file (binary or UTF-16?); "
            "a prompt file is JSON Lines in UTF-8"
        )
    try:
        return raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as error:
        raise PromptSourceError(
            f"{where}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
            "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None


def _parquet_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptSourceError(
            f"prompt file {str(path)!r} is parquet but pyarrow is not installed; "
            "pip install pyarrow"
        ) from None
    try:
        table = pq.read_table(path)
    except (pyarrow.ArrowException, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PromptSourceError(f"{path}: not a readable parquet file ({reason})") from None
    for number, row in enumerate(table.to_pylist(), start=1):
        yield number, f"{path} row {number}", row


@dataclass(frozen=True)
class RowKeys:
    """The fields of a data row that are not its ``meta``: prompt, answer, domain."""

    prompt: str
    answer: str
    domain: str


def _record_from_row(
    uid: str, where: str, row: dict[str, Any], keys: RowKeys, template: str
) -> PromptRecord:
    prompt_key, answer_key = keys.prompt, keys.answer
    for key in (prompt_key, answer_key):
        if key not in row:
            raise PromptSourceError(
                f"{where}: no field {key!r} (fields: {', '.join(map(str, row))}); "
                "set data.prompt_key / data.answer_key"
            )
    prompt, answer = row[prompt_key], row[answer_key]
    if not isinstance(prompt, str) or not prompt.strip():
        shown = "an empty text" if isinstance(prompt, str) else f"a {_kind(prompt)}"
        raise PromptSourceError(
            f"{where}: field {prompt_key!r} is {shown}; a prompt is a non-empty text "
            "(chat messages are not supported: give the text, data.chat_template applies the "
            "tokenizer's template)"
        )
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise PromptSourceError(
            f"{where}: field {answer_key!r} is a {_kind(answer)}; the ground truth is a text "
            "or a number"
        )
    fields = {**row, "prompt": prompt}
    try:
        text = template.format(**fields)
    except KeyError as error:
        raise PromptSourceError(
            f"{where}: template {template!r} names field {error.args[0]!r} the record lacks"
        ) from None
    except (IndexError, ValueError) as error:
        raise PromptSourceError(f"{where}: template {template!r} is malformed ({error})") from None
    meta = {k: v for k, v in row.items() if k not in (prompt_key, answer_key, keys.domain)}
    domain = _domain(row.get(keys.domain), where, keys.domain)
    return PromptRecord(uid, text, str(answer), prompt, domain, meta)


def _domain(value: Any, where: str, key: str) -> str:
    """A row's domain: its ``key`` field as text, ``default`` where it has none."""
    if value is None:
        return DEFAULT_DOMAIN
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        raise PromptSourceError(
            f"{where}: field {key!r} (the domain, data.domain_key) is "
            f"{'an empty text' if isinstance(value, str) else 'a ' + _kind(value)}; "
            "a domain is a name such as 'math' or 'code'"
        )
    return str(value)


def _kind(value: Any) -> str:
    """A JSON reader's name for ``value``'s type (null, list, object, ...)."""
    names = {type(None): "null", list: "list", dict: "JSON object", bool: "boolean"}
    return names.get(type(value), type(value).__name__)
