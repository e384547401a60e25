"""Algorithm maths against float64 references written independently with plain loops."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mindrl.config import AlgorithmConfig
from trainers.core import aggregate_loss, kl_penalty, masked_mean, policy_loss, value_loss
from trainers.dapo import filter_groups, overlong_penalty
from trainers.grpo import compute_advantages
from trainers.kl_control import AdaptiveKLController, FixedKLController
from trainers.ppo import compute_gae
from trainers.registry import get_algorithm


def random_batch(seed: int, batch: int = 6, length: int = 7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rand = lambda: torch.randn(batch, length, generator=g, dtype=torch.float64)  # noqa: E731
    return mask.double(), rand


def test_masked_mean_ignores_padding():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_mean(values, mask, dim=-1).tolist() == pytest.approx([1.5, 3.0])


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl", "abs"])
def test_kl_estimators_match_their_formulas(kind):
    logp = torch.tensor([-1.0, -2.0, -0.5, -30.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0, -0.5, -1.0], dtype=torch.float64)
    out = kl_penalty(logp, ref, kind)
    for i in range(4):
        d = logp[i].item() - ref[i].item()
        if kind == "k1":
            want = d
        elif kind == "k2":
            want = d * d / 2
        elif kind == "abs":
            want = abs(d)
        else:
            r = max(min(-d, 20.0), -20.0)
            want = max(min(math.exp(r) - r - 1, 10.0), -10.0)
        assert out[i].item() == pytest.approx(want)


def test_unknown_kl_kind_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: k1, k2, k3, low_var_kl, abs"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_token_mean_over_micro_batches_equals_the_full_batch():
    mask, rand = random_batch(0)
    loss = rand()
    total = aggregate_loss(loss, mask, "token-mean")
    global_tokens = mask.sum()
    parts = sum(
        aggregate_loss(loss[i : i + 2], mask[i : i + 2], "token-mean", global_tokens)
        for i in range(0, 6, 2)
    )
    assert parts.item() == pytest.approx(total.item())


def test_sequence_aggregations_match_loops():
    mask, rand = random_batch(1)
    loss = rand()
    seq_means = [sum(loss[i, t] * mask[i, t] for t in range(7)) / mask[i].sum() for i in range(6)]
    seq_norm = [sum(loss[i, t] * mask[i, t] for t in range(7)) / 7 for i in range(6)]
    got = aggregate_loss(loss, mask, "seq-mean-token-mean")
    assert got.item() == pytest.approx(float(sum(seq_means) / 6))
    got = aggregate_loss(loss, mask, "seq-mean-token-sum-norm")
    assert got.item() == pytest.approx(float(sum(seq_norm) / 6))


def reference_policy_loss(old, logp, adv, mask, lo, hi, c):
    total, count, clipped = 0.0, 0.0, 0.0
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            if not mask[i, t]:
                continue
            a = adv[i, t].item()
            r = math.exp(max(min(logp[i, t].item() - old[i, t].item(), 20), -20))
            unclipped, clip = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
            loss = max(unclipped, clip)
            if c is not None and a < 0:
                loss = min(loss, -a * c)
            total, count = total + loss, count + 1
            clipped += clip > unclipped
    return total / count, clipped / count


@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_policy_loss_matches_a_loop_reference_with_asymmetric_and_dual_clip(clip_c):
    mask, rand = random_batch(2)
    old, logp, adv = rand() * 0.1 - 1, rand() * 0.1 - 1, rand() * 2
    logp[0, 0] = old[0, 0] + 3.0  # ratio e^3 with negative advantage: dual clip territory
    adv[0, 0] = -1.0
    loss, metrics = policy_loss(old, logp, adv, mask, 0.2, 0.28, clip_c)
    want, want_clip = reference_policy_loss(old, logp, adv, mask, 0.2, 0.28, clip_c)
    assert loss.item() == pytest.approx(want)
    assert metrics["clip_fraction"] == pytest.approx(want_clip)
    assert (metrics["dual_clip_fraction"] > 0) == (clip_c is not None)


def test_policy_loss_in_float32_agrees_with_float64():
    mask, rand = random_batch(3)
    old, logp, adv = rand() * 0.1, rand() * 0.1, rand()
    loss64, _ = policy_loss(old, logp, adv, mask)
    loss32, _ = policy_loss(old.float(), logp.float(), adv.float(), mask.float())
    assert loss32.item() == pytest.approx(loss64.item(), abs=1e-5)


def test_value_loss_matches_a_loop_reference():
    mask, rand = random_batch(4)
    values, old, returns = rand(), rand(), rand()
    loss, _ = value_loss(values, old, returns, mask, clip=0.2)
    total, count = 0.0, 0.0
    for i in range(6):
        for t in range(7):
            if mask[i, t]:
                v, o, r = values[i, t].item(), old[i, t].item(), returns[i, t].item()
                vc = o + max(min(v - o, 0.2), -0.2)
                total += 0.5 * max((v - r) ** 2, (vc - r) ** 2)
                count += 1
    assert loss.item() == pytest.approx(total / count)


def test_grpo_advantages_group_by_id_not_position():
    mask = torch.ones(5, 2, dtype=torch.float64)
    rewards = torch.zeros(5, 2, dtype=torch.float64)
    rewards[:, -1] = torch.tensor([1.0, 5.0, 3.0, 7.0, 4.0])
    ids = torch.tensor([7, 3, 7, 3, 9])  # interleaved groups and a group of one
    adv = compute_advantages(rewards, mask, ids)
    group7 = [1.0, 3.0]
    mean7, std7 = 2.0, math.sqrt(sum((x - 2.0) ** 2 for x in group7) / 1)
    assert adv[0, 0].item() == pytest.approx((1.0 - mean7) / (std7 + 1e-6))
    std3 = math.sqrt(((5.0 - 6.0) ** 2 + (7.0 - 6.0) ** 2) / 1)
    assert adv[3, 1].item() == pytest.approx((7.0 - 6.0) / (std3 + 1e-6))
    assert adv[4].tolist() == pytest.approx([4.0 / (1 + 1e-6)] * 2)  # mean 0, std 1


def reference_gae(rewards, values, mask, gamma, lam):
    batch, length = values.shape
    adv = torch.zeros(batch, length, dtype=torch.float64)
    for i in range(batch):
        next_v, next_a = 0.0, 0.0
        for t in reversed(range(length)):
            if not mask[i, t]:
                continue
            delta = rewards[i, t].item() + gamma * next_v - values[i, t].item()
            next_a = delta + gamma * lam * next_a
            next_v = values[i, t].item()
            adv[i, t] = next_a
    returns = (adv + values) * mask
    flat = adv[mask.bool()]
    whitened = (adv - flat.mean()) / torch.sqrt(flat.var(unbiased=True) + 1e-8) * mask
    return whitened, returns


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.5, 1.0),
    hole=st.booleans(),
)
def test_gae_matches_a_loop_reference_with_padding_anywhere(seed, gamma, lam, hole):
    mask, rand = random_batch(seed)
    if hole:
        mask[:, 0] = 1
        mask[:, 1] = 0  # a masked token inside the response is skipped, not a cut
    rewards, values = rand(), rand()
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = reference_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(ret, want_ret)
    torch.testing.assert_close(adv, want_adv)


def test_dapo_keeps_only_groups_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    assert filter_groups(rewards, ids).tolist() == [False, False, True, True, False, False]


def test_dapo_overlong_penalty_is_zero_until_the_buffer_then_linear():
    got = overlong_penalty(torch.tensor([10, 12, 14, 16]), max_len=16, buffer=4, factor=1.0)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0])


def test_adaptive_kl_moves_towards_its_target_and_fixed_does_not():
    adaptive = AdaptiveKLController(0.1, target=0.01, horizon=100)
    adaptive.update(current_kl=0.05, n_steps=10)  # too much KL: coefficient grows, capped error
    assert adaptive.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    adaptive.update(current_kl=0.0, n_steps=10)
    assert adaptive.value < 0.1 * (1 + 0.2 * 10 / 100)
    fixed = FixedKLController(0.1)
    fixed.update(1.0, 10)
    assert fixed.value == 0.1


def test_the_registry_resolves_trainer_defaults_and_lists_known_names():
    dapo = get_algorithm("dapo").resolve(AlgorithmConfig())
    assert (dapo.clip_high, dapo.kl_coef, dapo.dynamic_sampling) == (0.28, 0.0, True)
    grpo = get_algorithm("grpo").resolve(AlgorithmConfig(kl_coef=0.0))
    assert not get_algorithm("grpo").needs_reference(grpo)
    assert get_algorithm("ppo").needs_critic
    with pytest.raises(ValueError, match="known: grpo, ppo, dapo"):
        get_algorithm("sft")
