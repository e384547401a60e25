"""File prompt sources: JSONL and parquet, templates, and errors that name the line."""

from __future__ import annotations

import json

import pytest

from mindrl.data import PromptSourceError, load_prompt_records


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_jsonl_records_use_the_configured_fields_and_template(tmp_path):
    rows = [{"q": "2+2?", "sol": 4, "topic": "add"}, {"q": "3*3?", "sol": "9", "topic": "mul"}]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    records = load_prompt_records(
        str(path), prompt_key="q", answer_key="sol", template="[{topic}] {prompt} Answer:"
    )
    assert [r.text for r in records] == ["[add] 2+2? Answer:", "[mul] 3*3? Answer:"]
    assert [r.answer for r in records] == ["4", "9"]
    assert [r.uid for r in records] == ["p.jsonl#1", "p.jsonl#2"]


def test_parquet_records_match_the_same_rows_in_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"prompt": f"next {d} =", "answer": str((d + 1) % 10)} for d in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    from_parquet = load_prompt_records(str(tmp_path / "p.parquet"))
    from_jsonl = load_prompt_records(str(_write_jsonl(tmp_path / "p.jsonl", rows)))
    assert [(r.text, r.answer) for r in from_parquet] == [(r.text, r.answer) for r in from_jsonl]
    assert from_parquet[4].uid == "p.parquet#5"


def test_missing_file_is_a_one_line_error(tmp_path):
    with pytest.raises(PromptSourceError, match=r"prompt file .*nope.jsonl' does not exist"):
        load_prompt_records(str(tmp_path / "nope.jsonl"))


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n')
    with pytest.raises(PromptSourceError, match=r"bad.jsonl:3: bad JSON"):
        load_prompt_records(str(path))


def test_missing_field_names_the_line_and_the_field(tmp_path):
    path = _write_jsonl(tmp_path / "f.jsonl", [{"prompt": "a", "answer": 1}, {"prompt": "b"}])
    with pytest.raises(PromptSourceError, match=r"f.jsonl:2: no field 'answer'"):
        load_prompt_records(str(path))


def test_template_naming_an_absent_field_names_the_line(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": 1}])
    with pytest.raises(PromptSourceError, match=r"t.jsonl:1: template .* names field 'topic'"):
        load_prompt_records(str(path), template="{topic}: {prompt}")


def test_unknown_file_format_is_refused(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt,answer\n")
    with pytest.raises(PromptSourceError, match=r"use \.jsonl or \.parquet"):
        load_prompt_records(str(path))


def test_synthetic_source_passes_count_and_seed():
    records = load_prompt_records("synthetic:tiny-copy", num_prompts=7, seed=5)
    assert len(records) == 7 and records[0].uid == "tiny-copy-5-0"


def test_a_rows_domain_and_its_other_fields_reach_the_record(tmp_path):
    rows = [{"q": "add 2 2", "a": 4, "kind": "math", "tests": ["assert f() == 1"], "level": 3}]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    (record,) = load_prompt_records(
        str(path), prompt_key="q", answer_key="a", template="Q: {prompt}", domain_key="kind"
    )
    assert (record.text, record.prompt, record.domain) == ("Q: add 2 2", "add 2 2", "math")
    assert record.meta == {"tests": ["assert f() == 1"], "level": 3}


def test_a_row_without_a_domain_is_in_the_default_domain(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x", "answer": "1", "domain": None}])
    path2 = _write_jsonl(tmp_path / "q.jsonl", [{"prompt": "x", "answer": "1"}])
    assert [load_prompt_records(str(p))[0].domain for p in (path, path2)] == ["default"] * 2


def test_a_domain_that_is_not_a_name_is_refused_naming_the_line(tmp_path):
    rows = [{"prompt": "x", "answer": "1"}, {"prompt": "y", "answer": "2", "domain": ["a"]}]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(PromptSourceError, match=r"p.jsonl:2: field 'domain' .* is a list"):
        load_prompt_records(str(path))
