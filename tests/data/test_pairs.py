"""Preference pairs as a run reads them: tokenized, in resumable batches, and one-line
errors for a pairs file that cannot be trained on."""

from __future__ import annotations

import json

import pytest

from mindrl.data import PromptSourceError, build_tiny_tokenizer
from mindrl.data.pairs import PairDataset, load_preference_pairs


def tiny_pairs(count: int = 12, batch: int = 4, **limits) -> PairDataset:
    pairs = load_preference_pairs("synthetic:tiny", count, seed=3)
    return PairDataset(pairs, build_tiny_tokenizer(), batch, seed=3, **limits)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def test_a_pair_batch_is_the_prompt_with_bos_and_each_response_ending_in_eos():
    tokenizer = build_tiny_tokenizer()
    data = tiny_pairs()
    batch = data.next_pairs()
    first = data.pairs[data._index[batch.uids[0]]]
    assert batch.prompt_ids[0] == tokenizer(first.prompt)["input_ids"]
    assert batch.prompt_ids[0][0] == tokenizer.bos_token_id
    assert tokenizer.decode(batch.chosen_ids[0][:-1]) == first.chosen
    assert tokenizer.decode(batch.rejected_ids[0][:-1]) == first.rejected
    assert batch.chosen_ids[0][-1] == batch.rejected_ids[0][-1] == tokenizer.eos_token_id
    assert batch.chosen_ids[0] != batch.rejected_ids[0] and len(batch.uids) == 4


def test_a_resumed_pair_dataset_draws_the_batch_an_uninterrupted_one_would():
    whole, resumed = tiny_pairs(), tiny_pairs()
    whole.next_pairs()
    resumed.load_state_dict(whole.state_dict())
    assert resumed.next_pairs() == whole.next_pairs()


def test_a_response_longer_than_the_rollout_limit_is_refused_naming_the_pair():
    with pytest.raises(ValueError, match=r"response of 2 tokens \(eos included\) > max_resp"):
        tiny_pairs(max_response_length=1)


def test_a_pairs_file_without_a_rejected_field_is_one_line_naming_the_line(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "next 1 =", "chosen": "2"}])
    with pytest.raises(PromptSourceError) as err:
        load_preference_pairs(path)
    assert str(err.value) == (
        f"{path}:1: no field 'rejected' (a pair needs prompt, chosen, rejected; fields: "
        "prompt, chosen)"
    )


def test_chat_messages_or_an_empty_file_are_refused_in_one_line(tmp_path):
    messages = [{"role": "assistant", "content": "2"}]
    row = {"prompt": "next 1 =", "chosen": messages, "rejected": "3"}
    with pytest.raises(PromptSourceError, match=r":1: field 'chosen' is a list; a pair's prompt"):
        load_preference_pairs(write_jsonl(tmp_path / "chat.jsonl", [row]))
    with pytest.raises(PromptSourceError, match=r"empty.jsonl' holds no pairs"):
        load_preference_pairs(write_jsonl(tmp_path / "empty.jsonl", []))


def test_parquet_pairs_read_like_the_same_rows_in_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"prompt": f"next {d} =", "chosen": str(d + 1), "rejected": "0"} for d in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    from_parquet = load_preference_pairs(str(tmp_path / "p.parquet"))
    from_jsonl = load_preference_pairs(write_jsonl(tmp_path / "p.jsonl", rows))
    key = [(p.prompt, p.chosen, p.rejected) for p in from_jsonl]
    assert [(p.prompt, p.chosen, p.rejected) for p in from_parquet] == key
