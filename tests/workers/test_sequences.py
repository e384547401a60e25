"""Prompt + response packing for the training engine (mindrl/workers/sequences.py)."""

from __future__ import annotations

import torch

from mindrl.workers.sequences import pack_rows, response_mask
from mindrl.workers.updates import minibatch_slices

PROMPTS = torch.tensor([[5, 6, 7], [8, 0, 0]])  # lengths 3, 1
PROMPT_LEN = torch.tensor([3, 1])
RESPONSES = torch.tensor([[9, 2], [4, 4]])  # lengths 1, 2
RESPONSE_LEN = torch.tensor([1, 2])


def test_rows_are_prompt_then_response_right_padded():
    packed = pack_rows(PROMPTS, PROMPT_LEN, RESPONSES, RESPONSE_LEN, pad_id=0)
    assert packed["input_ids"].tolist() == [[5, 6, 7, 9], [8, 4, 4, 0]]
    assert packed["response_start"].tolist() == [3, 1]
    assert response_mask(RESPONSE_LEN, 2).tolist() == [[1, 0], [1, 1]]


def test_mini_batches_cover_every_row_once_as_evenly_as_possible():
    parts = minibatch_slices(10, 3)
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 7), (7, 10)]
    assert [(p.start, p.stop) for p in minibatch_slices(4, 1)] == [(0, 4)]
