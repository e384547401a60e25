"""Expert parallelism when the data-parallel ranks pack rows of different lengths: the
CPU's allgather token dispatcher gathers the same number of tokens from every rank, so
the engine pads each micro-batch's row to the longest over the ranks (the pad is a
document no token sees): the step is the one rank's step on the whole batch."""

from __future__ import annotations

import pytest
import torch

from tests.megatron import cases
from tests.megatron.uneven_experts_cases import moe_step
from tests.support.spawn import run_ranks


@pytest.fixture(scope="module")
def steps():
    (one,) = run_ranks(moe_step, 1)
    return one, run_ranks(moe_step, 2)


def test_ep2_ranks_with_rows_of_different_lengths_train_like_one_rank(steps):
    one, two = steps
    for rank in range(2):
        cases.assert_same_step(two[rank], one)


def test_each_ep2_rank_scores_its_own_rows_like_one_rank(steps):
    one, two = steps
    for rank in range(2):
        rows = slice(2 * rank, 2 * rank + 2)
        for key in ("logprobs", "entropy"):
            torch.testing.assert_close(two[rank][key], one[key][rows], **cases.SAME_DEVICE_TOL)
