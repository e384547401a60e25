"""Prompt + response packing for the training engine, and the way back to the dock's
response-aligned layout (mindrl/workers/sequences.py)."""

from __future__ import annotations

import torch

from mindrl.workers.sequences import pack_rows, response_mask, to_response_aligned
from mindrl.workers.updates import minibatch_slices

PROMPTS = torch.tensor([[5, 6, 7], [8, 0, 0]])  # lengths 3, 1
PROMPT_LEN = torch.tensor([3, 1])
RESPONSES = torch.tensor([[9, 2], [4, 4]])  # lengths 1, 2
RESPONSE_LEN = torch.tensor([1, 2])


def test_rows_are_prompt_then_response_right_padded_with_the_loss_on_the_response():
    packed = pack_rows(PROMPTS, PROMPT_LEN, RESPONSES, RESPONSE_LEN, pad_id=0)
    assert packed["input_ids"].tolist() == [[5, 6, 7, 9], [8, 4, 4, 0]]
    assert packed["loss_mask"].tolist() == [[0, 0, 0, 1], [0, 1, 1, 0]]
    assert packed["response_start"].tolist() == [3, 1]


def test_per_position_values_come_back_aligned_to_response_tokens():
    packed = pack_rows(PROMPTS, PROMPT_LEN, RESPONSES, RESPONSE_LEN)
    positions = torch.arange(4.0).expand(2, 4) * 10  # value = 10 * position
    aligned = to_response_aligned(positions, packed["response_start"], width=2)
    # Row 0: response token 0 at position 3; position 4 is past the row and reads 0.
    assert aligned.tolist() == [[30.0, 0.0], [10.0, 20.0]]
    assert (aligned * response_mask(RESPONSE_LEN, 2)).tolist() == [[30.0, 0.0], [10.0, 20.0]]


def test_values_use_the_position_before_each_response_token():
    packed = pack_rows(PROMPTS, PROMPT_LEN, RESPONSES, RESPONSE_LEN)
    positions = torch.arange(4.0).expand(2, 4)
    aligned = to_response_aligned(positions, packed["response_start"] - 1, width=2)
    assert aligned.tolist() == [[2.0, 3.0], [0.0, 1.0]]


def test_mini_batches_cover_every_row_once_as_evenly_as_possible():
    parts = minibatch_slices(10, 3)
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 7), (7, 10)]
    assert [(p.start, p.stop) for p in minibatch_slices(4, 1)] == [(0, 4)]
