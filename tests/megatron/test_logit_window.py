"""Which outputs the training engine reads for a response, and where they land."""

from __future__ import annotations

import torch

from backends.megatron import ResponseBatch

# Rows: prompt 3 + response 3, prompt 1 + response 2 (+1 pad), prompt 4 + no response.
IDS = torch.tensor([[1, 2, 3, 10, 11, 12], [4, 20, 21, 0, 0, 0], [5, 6, 7, 8, 0, 0]])
BATCH = ResponseBatch(
    IDS,
    response_start=torch.tensor([3, 1, 4]),
    response_mask=torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]),
)


def test_each_response_token_is_scored_by_the_output_one_position_earlier():
    positions, tokens = BATCH.response_window()

    # Width 3: the longest response. Logits at t predict token t + 1.
    assert positions[0].tolist() == [2, 3, 4]
    assert tokens[0].tolist() == [10, 11, 12]
    assert positions[1, :2].tolist() == [0, 1]
    assert tokens[1, :2].tolist() == [20, 21]
    assert IDS.gather(1, positions[:2] + 1)[:, :2].tolist() == tokens[:2, :2].tolist()


def test_columns_past_the_end_stay_inside_the_row():
    positions, tokens = BATCH.response_window()
    assert int(positions.max()) <= IDS.shape[1] - 1 and int(positions.min()) >= 0
    assert tokens.shape == positions.shape == (3, 3)


def test_window_values_land_on_response_columns_and_padding_reads_zero_without_gradient():
    values = torch.tensor([[1.0, 2, 3], [4, 5, 99], [99, 99, 99]], requires_grad=True)

    spread = BATCH.spread(values)
    spread.sum().backward()

    assert spread.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [0, 0, 0, 0]]
    assert values.grad.tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0]]


def test_micro_batches_keep_every_row_once_with_its_fields():
    adv = torch.arange(12.0).view(3, 4)
    batch = ResponseBatch(BATCH.input_ids, BATCH.response_start, BATCH.response_mask, {"adv": adv})
    parts = batch.split(2)
    assert [len(p) for p in parts] == [2, 1]
    assert torch.equal(torch.cat([p.fields["adv"] for p in parts]), batch.fields["adv"])
    assert len(batch.split(None)) == 1
    assert batch.response_len.tolist() == [3, 2, 0]
