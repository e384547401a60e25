"""trainers.core against the float64 loop references, in float64 and float32."""

from __future__ import annotations

import math

import pytest
import torch

from tests.trainers import loop_reference as ref
from tests.trainers.batches import random_inputs
from trainers.core import aggregate_loss, kl_penalty, masked_mean, policy_loss, value_loss

KINDS = ["k1", "k2", "k3", "low_var_kl", "abs"]
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_masked_mean_matches_the_loop_over_valid_tokens():
    mask, (values,) = random_inputs(0, count=1)
    assert masked_mean(values, mask).item() == pytest.approx(ref.masked_mean(values, mask))
    per_row = masked_mean(values, mask, dim=-1)
    for i in range(values.shape[0]):
        assert per_row[i].item() == pytest.approx(
            ref.masked_mean(values[i : i + 1], mask[i : i + 1])
        )


def test_masked_mean_of_an_all_padding_row_is_zero_and_bool_masks_work():
    values = torch.tensor([[1.0, 2.0], [5.0, 7.0]])
    mask = torch.tensor([[True, False], [False, False]])
    assert masked_mean(values, mask, dim=-1).tolist() == [1.0, 0.0]
    assert masked_mean(values, torch.zeros(2, 2)).item() == 0.0


def test_nan_and_inf_in_padding_never_reach_a_result():
    mask, (old, logp, adv) = random_inputs(1)
    clean, _ = policy_loss(old, logp, adv, mask, clip_c=3.0)
    poisoned = [x.clone() for x in (old, logp, adv)]
    for x, junk in zip(poisoned, (math.nan, math.inf, -math.inf), strict=True):
        x[mask == 0] = junk
    loss, metrics = policy_loss(*poisoned, mask, clip_c=3.0)
    assert loss.item() == pytest.approx(clean.item())
    assert all(torch.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kl_estimators_match_their_formulas_with_clamps(kind, dtype):
    _, (logp, ref_logp) = random_inputs(2, count=2)
    logp[0, :4] = torch.tensor([-30.0, -1.0, 25.0, 0.0])  # log-ratios far past both clamps
    ref_logp[0, :4] = torch.tensor([-1.0, -30.0, 0.0, 25.0])
    got = kl_penalty(logp.to(dtype), ref_logp.to(dtype), kind)
    assert got.dtype == dtype
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            want = ref.kl(logp[i, t].item(), ref_logp[i, t].item(), kind)
            assert got[i, t].item() == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_k3_is_never_negative_and_clamped_at_ten():
    logp = torch.linspace(-40, 40, 81, dtype=torch.float64)
    k3 = kl_penalty(logp, torch.zeros_like(logp), "k3")
    assert (k3 >= 0).all() and k3.max().item() == 10.0


def test_unknown_kl_kind_lists_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown KL kind 'k4'; known: k1, k2, k3, low_var_kl, abs"
    ):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_aggregations_match_the_loop_reference(mode, dtype):
    mask, (loss,) = random_inputs(3, count=1)
    got = aggregate_loss(loss.to(dtype), mask.to(dtype), mode)
    assert got.dtype == dtype
    assert got.item() == pytest.approx(ref.aggregate(loss, mask, mode), rel=1e-5)


def test_seq_sum_norm_divides_by_the_padded_length_unless_told_a_constant():
    loss = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(
        (10 / 4 + 2 / 4) / 2
    )
    got = aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_len=8)
    assert got.item() == pytest.approx((10 / 8 + 2 / 8) / 2)


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_counts_add_up_to_the_full_batch(mode):
    mask, (loss,) = random_inputs(4, batch=12, count=1)
    full = aggregate_loss(loss, mask, mode)
    counts = {"num_tokens": mask.sum(), "num_seqs": int(mask.any(-1).sum())}
    if mode == "token-mean":
        counts.pop("num_seqs")
    else:
        counts["num_tokens"] = None
    parts = [
        aggregate_loss(loss[i : i + 3], mask[i : i + 3], mode, **counts) for i in range(0, 12, 3)
    ]
    local = [aggregate_loss(loss[i : i + 3], mask[i : i + 3], mode) for i in range(0, 12, 3)]
    assert sum(parts).item() == pytest.approx(full.item())
    assert sum(local).item() / 4 != pytest.approx(full.item())  # why the global count matters


def test_token_mean_with_num_tokens_differing_from_the_local_count():
    mask, (loss,) = random_inputs(5, count=1)
    got = aggregate_loss(loss, mask, "token-mean", num_tokens=1000)
    assert got.item() == pytest.approx(ref.aggregate(loss, mask, "token-mean", num_tokens=1000))


@pytest.mark.parametrize("mode", MODES)
def test_an_all_padding_batch_aggregates_to_zero_not_nan(mode):
    assert aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode).item() == 0.0


def test_unknown_aggregation_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: token-mean, seq-mean-token-mean, seq-mean"):
        aggregate_loss(torch.ones(1, 1), torch.ones(1, 1), "sum")


def policy_inputs(seed: int):
    mask, (old, logp, adv) = random_inputs(seed)
    old, logp = old * 0.3 - 2, old * 0.3 - 2 + logp * 0.3  # ratios around 1, some clipped
    logp[0, 0], adv[0, 0], mask[0, 0] = old[0, 0] + 3.0, -1.5, 1.0  # ratio e^3, A < 0
    return old, logp, adv * 2, mask


@pytest.mark.parametrize("clip_c", [None, 3.0])
@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_and_metrics_match_the_loop_reference(clip_c, mode):
    old, logp, adv, mask = policy_inputs(6)
    loss, metrics = policy_loss(old, logp, adv, mask, 0.2, 0.28, clip_c, mode)
    want, clip_frac, dual_frac, approx_kl = ref.policy_loss(
        old, logp, adv, mask, 0.2, 0.28, clip_c, mode
    )
    assert loss.item() == pytest.approx(want)
    assert metrics["clip_fraction"].item() == pytest.approx(clip_frac)
    assert metrics["dual_clip_fraction"].item() == pytest.approx(dual_frac)
    assert metrics["approx_kl"].item() == pytest.approx(approx_kl)
    assert (dual_frac > 0) == (clip_c is not None)


def test_policy_loss_in_float32_matches_the_float64_reference():
    old, logp, adv, mask = policy_inputs(7)
    loss, metrics = policy_loss(
        old.float(), logp.float(), adv.float(), mask.float(), 0.2, 0.28, 3.0
    )
    want, _, _, approx_kl = ref.policy_loss(old, logp, adv, mask, 0.2, 0.28, 3.0)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert metrics["approx_kl"].item() == pytest.approx(approx_kl, rel=1e-5, abs=1e-5)


def test_dual_clip_caps_a_negative_advantage_token_at_minus_a_times_c():
    old, logp = torch.zeros(1, 2), torch.tensor([[5.0, 5.0]])  # ratio e^5 ~ 148
    adv, mask = torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2)
    loss, metrics = policy_loss(old, logp, adv, mask, 0.2, 0.2, 3.0, "seq-mean-token-sum-norm")
    # token 0: capped at 3; token 1: A > 0 clipped to -1.2; sum 1.8 over T=2, one sequence
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2)
    assert metrics["dual_clip_fraction"].item() == pytest.approx(0.5)


def test_clipped_tokens_get_no_gradient_and_the_others_do():
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = torch.tensor([[0.5, 0.05, -0.5]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    loss, _ = policy_loss(old, logp, adv, torch.ones(1, 3), 0.2, 0.2)
    loss.backward()
    # d/dlogp of -A*r/3 is -r/3 while unclipped; the ratio e^0.5 > 1.2 is clipped (flat).
    # e^-0.5 < 0.8 with A > 0 is the pessimistic unclipped branch, so it keeps its gradient.
    want = [0.0, -math.exp(0.05) / 3, -math.exp(-0.5) / 3]
    assert logp.grad[0].tolist() == pytest.approx(want)


def test_policy_loss_refuses_a_dual_clip_bound_of_one_or_less():
    with pytest.raises(ValueError, match="clip_c must be > 1"):
        policy_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_c=1.0
        )


def test_policy_loss_over_micro_batches_equals_the_full_batch():
    old, logp, adv, mask = policy_inputs(8)
    full, _ = policy_loss(old, logp, adv, mask, 0.2, 0.28, 3.0)
    total = mask.sum()
    parts = [
        policy_loss(old[s], logp[s], adv[s], mask[s], 0.2, 0.28, 3.0, num_tokens=total)[0]
        for s in (slice(0, 4), slice(4, 7), slice(7, 10))
    ]
    assert sum(parts).item() == pytest.approx(full.item())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_value_loss_matches_the_loop_reference(mode, dtype):
    mask, (values, old, returns) = random_inputs(9)
    values = old + 0.4 * values  # half the tokens move further than the clip
    args = [x.to(dtype) for x in (values, old, returns, mask)]
    loss, metrics = value_loss(*args, clip=0.2, mode=mode)
    want, clip_frac = ref.value_loss(values, old, returns, mask, 0.2, mode)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert metrics["value_clip_fraction"].item() == pytest.approx(clip_frac)
    assert 0 < clip_frac < 1


# ---- off-policy samples: truncated importance weights for the policy lag -------------------


def lagged_inputs(seed: int):
    """Policy inputs plus behaviour log-probs some way off the old ones, both ways."""
    old, logp, adv, mask = policy_inputs(seed)
    behaviour = old + torch.linspace(-1.5, 1.0, old.numel(), dtype=old.dtype).view_as(old)
    return old, logp, adv, mask, behaviour


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cap", [2.0, 1.1])
def test_lagged_policy_loss_matches_the_loop_reference(mode, cap):
    old, logp, adv, mask, behaviour = lagged_inputs(10)
    loss, metrics = policy_loss(
        old, logp, adv, mask, 0.2, 0.28, 3.0, mode, behaviour=(behaviour, cap)
    )
    want, clip_frac, _, _ = ref.policy_loss(
        old, logp, adv, mask, 0.2, 0.28, 3.0, mode, behaviour=behaviour, cap=cap
    )
    weights = [[ref.tis_weight(o, b, cap) for o, b in zip(orow, brow, strict=True)]
               for orow, brow in zip(ref.rows(old), ref.rows(behaviour), strict=True)]  # fmt: skip
    truncated = [[float(w >= cap) for w in row] for row in weights]
    assert loss.item() == pytest.approx(want)
    assert metrics["clip_fraction"].item() == pytest.approx(clip_frac)
    assert metrics["is_weight_mean"].item() == pytest.approx(ref.masked_mean(weights, mask))
    assert metrics["is_truncated_fraction"].item() == pytest.approx(
        ref.masked_mean(truncated, mask)
    )
    assert 0 < metrics["is_truncated_fraction"].item() < 1  # the cap bites on some tokens only


def test_lagged_policy_loss_in_float32_matches_the_float64_reference():
    old, logp, adv, mask, behaviour = lagged_inputs(11)
    as32 = [t.float() for t in (old, logp, adv, mask, behaviour)]
    loss, _ = policy_loss(*as32[:4], 0.2, 0.28, 3.0, behaviour=(as32[4], 2.0))
    want, *_ = ref.policy_loss(old, logp, adv, mask, 0.2, 0.28, 3.0, behaviour=behaviour, cap=2.0)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_samples_of_the_trained_policy_get_weight_one_and_the_plain_loss():
    old, logp, adv, mask = policy_inputs(12)
    plain, _ = policy_loss(old, logp, adv, mask, 0.2, 0.28, 3.0)
    lagged, metrics = policy_loss(old, logp, adv, mask, 0.2, 0.28, 3.0, behaviour=(old, 2.0))
    assert lagged.item() == plain.item()
    assert metrics["is_weight_mean"].item() == 1.0


def test_the_weight_is_a_constant_of_the_step_so_one_step_gives_the_tis_gradient():
    # One optimizer step: old = logp (detached), r = 1, and the gradient of each token is
    # TIS's -min(pi / mu, C) * A / n (Yao et al. 2025), not the plain -A / n.
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    behaviour = torch.tensor([[-1.5, -1.0, -3.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    loss, _ = policy_loss(
        logp.detach(), logp, adv, torch.ones(1, 3), 0.2, 0.2, behaviour=(behaviour, 2.0)
    )
    loss.backward()
    weights = [math.exp(0.5), math.exp(-1.0), 2.0]  # e^2.5 > 2 is truncated to the cap
    want = [-w * a / 3 for w, a in zip(weights, [1.0, -2.0, 0.5], strict=True)]
    assert logp.grad[0].tolist() == pytest.approx(want)


def test_no_gradient_flows_through_the_weight_even_from_old_logprobs_with_a_graph():
    # old is logp itself (graph and all): the ratio is identically 1, so the only path a
    # gradient could take is through the weight, which must be a constant.
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    behaviour = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    loss, _ = policy_loss(
        logp, logp, torch.ones(1, 2), torch.ones(1, 2), behaviour=(behaviour, 2.0)
    )
    loss.backward()
    assert logp.grad[0].tolist() == [0.0, 0.0]
