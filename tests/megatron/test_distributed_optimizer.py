"""Megatron's distributed optimizer (``OptimSpec.distributed_optimizer``) steps like AdamW.

DP=2 (Adam moments sharded over the two ranks), TP=2 and PP=2 (DP=1; PP splits the tied
embedding over both stages), a q/k-layernorm model at TP=2 and an MoE at EP=2 (a dense
and an expert optimizer) start from the shared per-name weights and train 3 steps
(warm-up + cosine lr, weight decay, a grad clip active in some steps) on the same global
batches as one rank running torch AdamW: same loss, grad norm and lr at every step and
the same weights after every step. A checkpoint resume reproduces the next two losses
and the weights bit for bit, and torch AdamW resumes the same checkpoint.
"""

from __future__ import annotations

import pytest
import torch

from tests.megatron import distopt_cases
from tests.support.spawn import run_ranks

TOL = {"rtol": 1e-4, "atol": 2e-5}  # as the other layout tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 1-rank spawn (AdamW reference) and one 2-rank spawn (distributed optimizer)."""
    root = str(tmp_path_factory.mktemp("distopt_ckpt"))
    (reference,) = run_ranks(distopt_cases.adamw_on_one_rank, 1)
    two = run_ranks(distopt_cases.distributed_on_two_ranks, 2, root)
    return reference, two


def test_the_reference_steps_are_clipped_in_some_steps_and_not_in_others(runs):
    reference, _ = runs
    clip = distopt_cases.ADAMW.clip_grad
    norms = [step["grad_norm"] for step in reference["dense"]]
    assert any(norm > clip for norm in norms) and any(norm < clip for norm in norms)


@pytest.mark.parametrize(
    ("layout", "model"),
    [("dp2", "dense"), ("tp2", "dense"), ("pp2", "dense"), ("qk_tp2", "qk"), ("moe_ep2", "moe")],
)
def test_the_distributed_optimizer_steps_exactly_like_adamw_on_one_rank(runs, layout, model):
    references, two = runs
    reference = references[model]
    for rank in range(2):
        steps = two[rank][layout]
        assert len(steps) == len(reference)
        for got, want in zip(steps, reference, strict=True):
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
            assert got["lr"] == want["lr"]
            for name, weight in want["weights"].items():
                torch.testing.assert_close(got["weights"][name], weight, **TOL, msg=name)


def test_each_data_parallel_rank_keeps_only_its_share_of_the_adam_moments(runs):
    references, two = runs
    total = references["dense"][-1]["params"]
    assert references["dense"][-1]["moments"] == total  # AdamW: every moment on the one rank
    shares = [two[rank]["dp2"][-1]["moments"] for rank in range(2)]
    assert sum(shares) == total and max(shares) < total
    assert two[0]["tp2"][-1]["moments"] == two[0]["tp2"][-1]["params"]  # DP=1: all of them


def test_resuming_with_the_distributed_optimizer_continues_exactly_like_an_uninterrupted_run(
    runs,
):
    _, two = runs
    for rank in range(2):
        resume = two[rank]["resume"]
        assert resume["resumed"] == resume["uninterrupted"][2:]  # bit-exact on CPU
        assert resume["same_weights"]
        assert len(set(resume["uninterrupted"])) == 4
        # The checkpoint's moments are canonical tensors: torch AdamW steps on from them.
        assert resume["with_adamw"] == pytest.approx(resume["uninterrupted"][2:], rel=1e-5)


def test_bf16_main_weights_follow_the_loaded_weights(runs):
    _, two = runs
    assert two[0]["bf16"] and two[1]["bf16"]
