"""Malformed prompt and pair files, as a new user brings them: every one is refused before
any process starts, in one line naming the file (and the line or row), what is wrong and
the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mindrl.config import load_config
from trainers.driver.setup import RunSetupError, prepare_run

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"


def _jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


GOOD = {"prompt": "next 1 2 =", "answer": "3"}

#: name -> (file bytes, what the one line must say). The file's path is always named.
PROMPT_FILES = {
    "latin1.jsonl": (
        _jsonl(GOOD) + b'{"prompt": "caf\xe9", "answer": "1"}\n',
        r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9 at column 16\); re-encode",
    ),
    "binary.jsonl": (b"\xd2\x00\x17\x80\x00\xff" * 20, r"binary.jsonl:1: holds NUL bytes"),
    "utf16.jsonl": (json.dumps(GOOD).encode("utf-16"), r"utf16.jsonl:1: holds NUL bytes"),
    "empty.jsonl": (b"", r"empty.jsonl' holds no prompts \(it is empty or blank\)"),
    "blank.jsonl": (b"\n  \n\n", r"blank.jsonl' holds no prompts"),
    "array.jsonl": (
        json.dumps([GOOD, GOOD], indent=1).encode(),
        r"array.jsonl:1: bad JSON .* looks like one JSON array",
    ),
    "truncated.jsonl": (
        _jsonl(GOOD) + b'{"prompt": "next 4 =", "ans',
        r"truncated.jsonl:2: bad JSON",
    ),
    "number.jsonl": (_jsonl(GOOD, 42), r"number.jsonl:2: expected a JSON object, got int"),
    "null_prompt.jsonl": (
        _jsonl(GOOD, {"prompt": None, "answer": "1"}),
        r"null_prompt.jsonl:2: field 'prompt' is a null; a prompt is a non-empty text",
    ),
    "chat_prompt.jsonl": (
        _jsonl({"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}),
        r"chat_prompt.jsonl:1: field 'prompt' is a list; .*chat messages are not supported",
    ),
    "empty_prompt.jsonl": (
        _jsonl({"prompt": "  ", "answer": "1"}),
        r"empty_prompt.jsonl:1: field 'prompt' is an empty text",
    ),
    "dict_answer.jsonl": (
        _jsonl({"prompt": "next 1 =", "answer": {"value": 2}}),
        r"dict_answer.jsonl:1: field 'answer' is a JSON object; the ground truth is a text",
    ),
    "no_answer.jsonl": (
        _jsonl({"prompt": "next 1 ="}),
        r"no_answer.jsonl:1: no field 'answer' .*set data.prompt_key / data.answer_key",
    ),
    "one_prompt.jsonl": (
        _jsonl(GOOD),
        r"data.global_batch_size=16 needs at least that many prompts, data.source "
        r"'.*one_prompt.jsonl' gives 1; lower data.global_batch_size to at most 1",
    ),
    "prompts.json": (json.dumps([GOOD]).encode(), r"unknown format '.json'.*rename it .jsonl"),
    "broken.parquet": (b"PAR1 not really", r"broken.parquet: not a readable parquet file"),
}


def _prepare(tmp_path: Path, source: str, trainer: str = "grpo", config: Path = TINY) -> None:
    overrides = [f"data.source={source}", f"logging.dir={tmp_path / 'run'}"]
    prepare_run(load_config(config, overrides), trainer, resume=False)


@pytest.mark.parametrize("name", sorted(PROMPT_FILES))
def test_a_malformed_prompt_file_is_one_line_naming_the_file_and_the_fix(tmp_path, name):
    content, expected = PROMPT_FILES[name]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(RunSetupError, match=expected) as error:
        _prepare(tmp_path, str(path))
    message = str(error.value)
    assert "\n" not in message and str(path) in message


def test_a_folder_or_a_missing_file_is_named(tmp_path):
    with pytest.raises(RunSetupError, match=r"prompt file '.*' is a folder; name a .jsonl"):
        _prepare(tmp_path, str(tmp_path))
    with pytest.raises(RunSetupError, match=r"prompt file '.*nope.jsonl' does not exist"):
        _prepare(tmp_path, str(tmp_path / "nope.jsonl"))


def test_a_byte_order_mark_on_the_first_line_is_read_as_utf8(tmp_path):
    rows = [{"prompt": f"next {d} =", "answer": str(d + 1)} for d in range(16)]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _jsonl(*rows))
    _prepare(tmp_path, str(path))  # no error: Windows editors write the mark


def test_a_pairs_file_with_too_few_pairs_names_the_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(_jsonl({"prompt": "next 1 =", "chosen": "2", "rejected": "3"}))
    with pytest.raises(RunSetupError, match=r"data.source '.*pairs.jsonl' gives 1"):
        _prepare(tmp_path, str(path), "dpo", ROOT / "configs" / "tiny_dpo.yaml")


def test_the_command_prints_one_line_and_exits_2_without_a_traceback(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(PROMPT_FILES["latin1.jsonl"][0])
    done = subprocess.run(
        [sys.executable, "-m", "trainers.driver.cli", "--trainer", "grpo", f"data.source={path}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("mindrl-train")]
    assert errors == [
        f"mindrl-train: error: {path}:2: not UTF-8 text (byte 0xe9 at column 16); re-encode "
        "the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
    ]
    assert "Traceback" not in done.stderr
