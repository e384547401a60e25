"""Which logits the training engine computes for a loss mask, and where results land."""

from __future__ import annotations

import torch

from backends.megatron.logit_window import logit_positions, place_at_tokens


def test_each_row_gets_the_positions_predicting_its_first_to_last_masked_token():
    loss_mask = torch.tensor(
        [
            [0, 0, 0, 1, 1, 1, 0],  # a response at 3..5: logits at 2..4
            [0, 1, 0, 0, 1, 0, 0],  # a gap inside is computed too: 0..3
            [1, 1, 0, 0, 0, 0, 0],  # token 0 has no logit predicting it: 0 only
            [0, 0, 0, 0, 0, 0, 0],  # nothing masked: nothing computed
        ]
    )

    positions, valid = logit_positions(loss_mask)

    assert valid.tolist() == [
        [True, True, True, False],
        [True, True, True, True],
        [True, False, False, False],
        [False, False, False, False],
    ]
    assert (positions * valid).tolist() == [[2, 3, 4, 0], [0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_window_values_land_at_the_tokens_they_predict_and_nothing_else_moves():
    loss_mask = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 0, 1]])
    positions, valid = logit_positions(loss_mask)  # widths 2 and 1
    values = torch.tensor([[10.0, 20.0], [30.0, 99.0]], requires_grad=True)  # 99: padding

    placed = place_at_tokens(values, positions, valid, seq_len=5)
    placed.sum().backward()

    assert placed.tolist() == [[0, 0, 10, 20, 0], [0, 0, 0, 0, 30]]
    assert values.grad.tolist() == [[1, 1], [1, 0]]  # the padding entry gets no gradient
