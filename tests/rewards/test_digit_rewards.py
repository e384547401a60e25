"""Digit-task rewards: partial credit per position, exact match."""

from __future__ import annotations

import pytest

from mindrl.rewards import digit_partial_reward, exact_match_reward


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("3 1", "3 1", 1.0),
        ("31", "3 1", 1.0),
        ("3 2", "3 1", 0.5),
        ("3 1 7", "3 1", 2 / 3),  # one token too many
        ("3", "3 1", 0.5),  # stopped too early
        ("1 3", "3 1", 0.0),
        ("3 <unk>", "3 1", 0.5),  # an unknown token is one wrong position
        ("", "5", 0.0),
        ("5 5 5 5 5 5 5 5", "5", 1 / 8),  # never stopped
    ],
)
def test_partial_credit_counts_right_positions_over_the_longer_length(response, truth, expected):
    assert digit_partial_reward(response, truth) == pytest.approx(expected)


def test_exact_match_only_for_the_whole_answer():
    assert exact_match_reward("4 1 3", "4 1 3") == 1.0
    assert exact_match_reward(" 413 ", "4 1 3") == 1.0
    assert exact_match_reward("4 1", "4 1 3") == 0.0
