"""PromptDataset: seeded per-epoch shuffles, fixed-size batches, exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from mindrl.data import PromptDataset, build_tiny_tokenizer, make_synthetic


def _dataset(num_prompts=10, batch_size=4, seed=0, **kwargs):
    records = make_synthetic("tiny-copy", num_prompts, seed=1)
    return PromptDataset(records, build_tiny_tokenizer(), batch_size, seed=seed, **kwargs)


def test_batches_carry_tokenized_prompts_truths_and_uids():
    dataset = _dataset(shuffle=False)
    tokenizer = build_tiny_tokenizer()
    batch = dataset.next_batch()
    records = dataset.records[:4]
    assert batch.uids == [r.uid for r in records]
    assert batch.ground_truths == [r.answer for r in records]
    assert batch.prompt_ids == [tokenizer(r.text)["input_ids"] for r in records]
    assert (batch.epoch, batch.offset, len(batch)) == (0, 0, 4)


def test_each_epoch_is_a_seeded_permutation_and_the_tail_is_skipped():
    dataset = _dataset(num_prompts=10, batch_size=4, seed=3)
    uids = [dataset.next_batch().uids for _ in range(4)]  # 2 per epoch (10 // 4)
    order0 = np.random.default_rng([3, 0]).permutation(10)
    order1 = np.random.default_rng([3, 1]).permutation(10)
    assert uids[0] + uids[1] == [dataset.records[i].uid for i in order0[:8]]
    assert uids[2] + uids[3] == [dataset.records[i].uid for i in order1[:8]]
    assert dataset.batches_per_epoch == 2
    assert uids[0] + uids[1] != uids[2] + uids[3]


def test_resume_from_state_dict_gives_exactly_the_next_batch():
    original = _dataset(num_prompts=10, batch_size=3, seed=9)
    for _ in range(4):  # crosses an epoch boundary (3 batches per epoch)
        original.next_batch()
    state = original.state_dict()
    expected = [original.next_batch() for _ in range(3)]
    resumed = _dataset(num_prompts=10, batch_size=3, seed=9)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(3)] == expected
    assert state == {"epoch": 1, "offset": 3, "seed": 9}


def test_resume_with_another_seed_is_refused():
    dataset = _dataset(seed=1)
    with pytest.raises(ValueError, match="resume with the same seed"):
        dataset.load_state_dict({"epoch": 0, "offset": 4, "seed": 2})


def test_too_long_prompt_and_too_large_batch_are_clear_errors():
    with pytest.raises(ValueError, match="max_prompt_length 3"):
        _dataset(max_prompt_length=3)
    with pytest.raises(ValueError, match="global_batch_size"):
        _dataset(num_prompts=3, batch_size=4)


def test_chat_template_is_applied_when_the_tokenizer_has_one():
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}: {{ m['content'] }} ={% endfor %}"
    records = make_synthetic("tiny-next", 4, seed=0)
    dataset = PromptDataset(records, tokenizer, batch_size=4, shuffle=False)
    assert dataset.texts[0] == f": {records[0].text} ="
    plain = PromptDataset(records, tokenizer, batch_size=4, shuffle=False, chat="never")
    assert plain.texts[0] == records[0].text
