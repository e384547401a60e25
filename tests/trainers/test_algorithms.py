"""The algorithm descriptions (registry, options, loss assembly) and the KL controllers."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import torch

from mindrl.config import AlgorithmConfig
from tests.trainers import loop_reference as ref
from tests.trainers.batches import random_inputs
from trainers.kl_control import AdaptiveKLController, FixedKLController, make_kl_controller
from trainers.registry import ALGORITHMS, get_algorithm

TRAINERS = Path(__file__).resolve().parents[2] / "trainers"
MATHS = ["__init__.py", "core.py", "grpo.py", "ppo.py", "dapo.py", "registry.py", "kl_control.py"]
MATHS += ["pf_ppo.py", "reinforce_pp.py", "rloo.py", "gspo.py", "dr_grpo.py", "dpo.py"]


#: What the maths may import from mindrl: the algorithm contract and its options, nothing
#: that starts processes or touches a model.
CONTRACT = {"mindrl.algorithm", "mindrl.config.schema"}


@pytest.mark.parametrize("module", MATHS)
def test_the_algorithm_maths_imports_only_the_contract_from_mindrl(module):
    tree = ast.parse((TRAINERS / module).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    outside = [m for m in imported if m and m.split(".")[0] in ("mindrl", "ray", "megatron")]
    assert [m for m in outside if m not in CONTRACT] == []


NAMES = ["grpo", "ppo", "dapo", "pf_ppo", "reinforce_pp", "rloo", "gspo", "dr_grpo", "dpo"]


def test_the_registry_finds_each_algorithm_and_lists_the_known_ones():
    assert list(ALGORITHMS) == NAMES
    described = {
        name: (algo.name, algo.needs_critic, algo.needs_reference, algo.uses_groups)
        for name in ALGORITHMS
        for algo in [get_algorithm(name)]
    }
    assert described == {
        "grpo": ("grpo", False, True, True),
        "ppo": ("ppo", True, True, False),
        "dapo": ("dapo", False, False, True),
        "pf_ppo": ("pf_ppo", True, True, True),
        "reinforce_pp": ("reinforce_pp", False, False, False),
        "rloo": ("rloo", False, False, True),
        "gspo": ("gspo", False, False, True),
        "dr_grpo": ("dr_grpo", False, False, True),
        "dpo": ("dpo", False, True, True),
    }
    with pytest.raises(ValueError, match=f"unknown algorithm 'sft'; known: {', '.join(NAMES)}"):
        get_algorithm("sft")


def test_the_package_docstring_names_every_registered_algorithm_and_its_file():
    import trainers

    listed = re.findall(r"``(\w+)`` \((\w+)\.py", trainers.__doc__)
    assert sorted(listed) == sorted((name, name) for name in ALGORITHMS)


@pytest.mark.parametrize("name", NAMES)
def test_defaults_name_real_config_fields_and_agree_with_needs_reference(name):
    algo = get_algorithm(name)
    config_fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    assert set(algo.defaults) <= config_fields
    options = algo.resolve(AlgorithmConfig())
    assert algo.uses_reference(options) == algo.needs_reference


@pytest.mark.parametrize("name", NAMES)
def test_resolved_options_are_the_config_section_with_no_field_left_unset(name):
    algo = get_algorithm(name)
    options = algo.resolve(AlgorithmConfig())
    assert isinstance(options, AlgorithmConfig)
    unset = [f.name for f in dataclasses.fields(options) if getattr(options, f.name) is None]
    # clip_c defaults to 3.0 (None would switch dual clip off); another algorithm's own
    # options stay unset, which is how they are refused here when a recipe sets them;
    # norm_len comes from the rollout section (mindrl.algorithm.run_options).
    others = {key for key in algo.OPTION_OWNERS if key not in algo.own_options}
    assert sorted(set(unset) - others) in ([], ["norm_len"])


def test_dapo_defaults_apply_where_the_config_is_unset_and_explicit_values_win():
    dapo = get_algorithm("dapo")
    options = dapo.resolve(AlgorithmConfig())
    assert (options.clip_low, options.clip_high, options.kl_coef) == (0.2, 0.28, 0.0)
    assert (options.loss_agg_mode, options.dynamic_sampling, options.clip_c) == (
        "token-mean",
        True,
        3.0,
    )
    explicit = dapo.resolve(AlgorithmConfig(clip_high=0.3, kl_coef=0.01, clip_c=None))
    assert (explicit.clip_high, explicit.kl_coef, explicit.clip_c) == (0.3, 0.01, None)
    assert dapo.uses_reference(explicit)
    assert dapo.resolve({"gamma": 0.9}).gamma == 0.9 and dapo.resolve(None).clip_high == 0.28


def test_ppo_defaults_to_monte_carlo_gae_with_an_entropy_bonus_and_grpo_has_none():
    ppo, pf_ppo, grpo = (get_algorithm(name) for name in ("ppo", "pf_ppo", "grpo"))
    assert (ppo.resolve().lam, ppo.resolve().entropy_coef) == (1.0, 0.05)
    assert (pf_ppo.resolve().lam, pf_ppo.resolve().entropy_coef) == (1.0, 0.05)
    assert grpo.resolve().entropy_coef == 0.0
    explicit = ppo.resolve(AlgorithmConfig(lam=0.95, entropy_coef=0.0))
    assert (explicit.lam, explicit.entropy_coef) == (0.95, 0.0)


def test_ppo_default_gae_is_the_discounted_return_minus_the_value_whitened():
    mask, (rewards, values) = random_inputs(2, count=2)
    ppo = get_algorithm("ppo")
    batch = {"token_rewards": rewards, "values": values, "response_mask": mask}
    out = ppo.compute_advantages(batch, ppo.resolve({"gamma": 0.9}))
    # lam = 1: A_t = (sum over later valid k of gamma^steps r_k) - V_t, whitened over the batch.
    returns, raw, where = [], [], []
    for row in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[row, t] > 0]
        for i, t in enumerate(valid):
            ret = sum(0.9**j * rewards[row, k].item() for j, k in enumerate(valid[i:]))
            returns.append(ret)
            raw.append(ret - values[row, t].item())
            where.append((row, t))
    mean = sum(raw) / len(raw)
    std = (sum((a - mean) ** 2 for a in raw) / (len(raw) - 1)) ** 0.5
    for (row, t), ret, adv in zip(where, returns, raw, strict=True):
        assert out["returns"][row, t].item() == pytest.approx(ret, rel=1e-9)
        assert out["advantages"][row, t].item() == pytest.approx((adv - mean) / std, rel=1e-6)


def test_resolve_refuses_unknown_keys_and_dapo_features_on_other_algorithms():
    with pytest.raises(ValueError, match=r"unknown algorithm options \['clip_hi'\]"):
        get_algorithm("grpo").resolve({"clip_hi": 0.3})
    with pytest.raises(ValueError, match=r"algorithm\.dynamic_sampling is a dapo feature; grpo"):
        get_algorithm("grpo").resolve(AlgorithmConfig(dynamic_sampling=True))
    with pytest.raises(ValueError, match=r"algorithm\.overlong_buffer is a dapo feature; ppo"):
        get_algorithm("ppo").resolve({"overlong_buffer": 16})


def test_grpo_without_kl_needs_no_reference():
    grpo = get_algorithm("grpo")
    assert not grpo.uses_reference(grpo.resolve(AlgorithmConfig(kl_coef=0.0)))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_actor_loss_is_policy_loss_plus_kl_minus_entropy(mode):
    mask, (old, logp, adv, ref_logp, entropy) = random_inputs(0, count=5)
    old, logp, ref_logp = old * 0.2 - 1, logp * 0.2 - 1, ref_logp * 0.2 - 1
    grpo = get_algorithm("grpo")
    options = grpo.resolve(
        {"kl_coef": 0.05, "kl_kind": "k3", "entropy_coef": 0.01, "loss_agg_mode": mode}
    )
    batch = {"old_logprob": old, "advantages": adv, "response_mask": mask, "ref_logprob": ref_logp}
    loss, metrics = grpo.actor_loss(logp, batch, options, entropy=entropy)
    pg, *_ = ref.policy_loss(old, logp, adv, mask, 0.2, 0.2, 3.0, mode)
    kl = [
        [ref.kl(a, b, "k3") for a, b in zip(ra, rb, strict=True)]
        for ra, rb in zip(logp.tolist(), ref_logp.tolist(), strict=True)
    ]
    want = pg + 0.05 * ref.aggregate(kl, mask, mode) - 0.01 * ref.aggregate(entropy, mask, mode)
    assert loss.item() == pytest.approx(want)
    assert metrics["kl"].item() == pytest.approx(ref.masked_mean(kl, mask))
    assert metrics["pg_loss"].item() == pytest.approx(pg)


def test_actor_loss_weights_lagged_samples_by_their_truncated_behaviour_ratio():
    mask, (logp, adv, behaviour) = random_inputs(2, count=3)
    logp, behaviour = logp * 0.5 - 1, behaviour * 0.5 - 1
    grpo = get_algorithm("grpo")
    options = grpo.resolve({"kl_coef": 0.0, "behaviour_is_cap": 1.5})
    batch = {"advantages": adv, "response_mask": mask, "behaviour_logprob": behaviour}
    loss, metrics = grpo.actor_loss(logp, batch, options)
    # No old log-probs: the trained policy is the proximal one (old = logp, ratio 1).
    want, *_ = ref.policy_loss(logp, logp, adv, mask, 0.2, 0.2, 3.0, behaviour=behaviour, cap=1.5)
    assert loss.item() == pytest.approx(want)
    assert 0 < metrics["is_truncated_fraction"].item() < 1


def test_actor_loss_on_policy_without_old_logprob_is_minus_the_mean_advantage():
    mask, (logp, adv) = random_inputs(1, count=2)
    dapo = get_algorithm("dapo")
    batch = {"advantages": adv, "response_mask": mask}
    loss, metrics = dapo.actor_loss(logp.requires_grad_(), batch, dapo.resolve())
    assert loss.item() == pytest.approx(-ref.masked_mean(adv, mask))
    assert "kl" not in metrics  # dapo: no KL, no reference log-probs needed
    loss.backward()
    assert logp.grad is not None


def test_grpo_and_dapo_compute_group_advantages_and_ppo_gae():
    mask, (rewards, values) = random_inputs(2, count=2)
    ids = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    batch = {"token_rewards": rewards, "response_mask": mask, "group_ids": ids, "values": values}
    for name in ("grpo", "dapo"):
        algo = get_algorithm(name)
        got = algo.compute_advantages(batch, algo.resolve())["advantages"]
        torch.testing.assert_close(
            got, torch.tensor(ref.grpo(rewards, mask, ids), dtype=torch.float64)
        )
    ppo = get_algorithm("ppo")
    out = ppo.compute_advantages(batch, ppo.resolve({"gamma": 0.99, "lam": 0.9}))
    want_adv, want_returns = ref.gae(rewards, values, mask, 0.99, 0.9)
    torch.testing.assert_close(out["advantages"], torch.tensor(want_adv, dtype=torch.float64))
    torch.testing.assert_close(out["returns"], torch.tensor(want_returns, dtype=torch.float64))


def test_ppo_critic_loss_is_the_clipped_value_loss():
    mask, (values, old, returns) = random_inputs(3)
    ppo = get_algorithm("ppo")
    batch = {"old_values": old, "returns": returns, "response_mask": mask}
    loss, metrics = ppo.critic_loss(values, batch, ppo.resolve({"value_clip": 0.5}))
    want, clip_frac = ref.value_loss(values, old, returns, mask, 0.5)
    assert loss.item() == pytest.approx(want)
    assert metrics["value_clip_fraction"].item() == pytest.approx(clip_frac)


def test_dapo_filters_equal_groups_and_shapes_overlong_rewards_only_when_asked():
    dapo, grpo = get_algorithm("dapo"), get_algorithm("grpo")
    rewards, ids = torch.tensor([1.0, 1.0, 0.0, 1.0]), ["a", "a", "b", "b"]
    assert dapo.keep_mask(rewards, ids, dapo.resolve()).tolist() == [False, False, True, True]
    off = dapo.resolve({"dynamic_sampling": False})
    assert (
        dapo.keep_mask(rewards, ids, off).all()
        and grpo.keep_mask(rewards, ids, grpo.resolve()).all()
    )
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    options = dapo.resolve({"overlong_buffer": 2, "overlong_factor": 1.0})
    shaped = dapo.shape_rewards(torch.zeros(2, 4), mask, 4, options)
    assert shaped.tolist() == [[0.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]
    assert dapo.shape_rewards(torch.ones(2, 4), mask, 4, dapo.resolve()).eq(1).all()


def test_adaptive_kl_raises_the_coefficient_above_target_and_lowers_it_below():
    controller = AdaptiveKLController(0.1, target=0.01, horizon=100)
    controller.update(current_kl=0.05, n_steps=10)  # 5x the target: error clipped to +0.2
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    high = controller.value
    controller.update(current_kl=0.009, n_steps=10)  # 10% under the target
    assert controller.value == pytest.approx(high * (1 - 0.1 * 10 / 100))
    controller.update(current_kl=0.0, n_steps=10)  # error clipped to -0.2
    assert controller.value == pytest.approx(high * 0.99 * 0.98)
    controller.update(current_kl=0.01, n_steps=10)  # on target: unchanged
    assert controller.value == pytest.approx(high * 0.99 * 0.98)


def test_fixed_kl_never_moves_and_the_factory_picks_by_the_options():
    fixed = make_kl_controller(0.1, adaptive=False, target=0.01, horizon=10)
    fixed.update(1.0, 10)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.1
    assert isinstance(make_kl_controller(0.1, True, 0.01, 10), AdaptiveKLController)
    with pytest.raises(ValueError, match="target > 0 and horizon > 0"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_actor_loss_over_micro_batches_with_global_counts_equals_the_full_batch(mode):
    mask, (old, logp, adv, ref_logp, entropy) = random_inputs(4, count=5)
    grpo = get_algorithm("grpo")
    options = grpo.resolve({"kl_coef": 0.1, "entropy_coef": 0.01, "loss_agg_mode": mode})
    names = ("old_logprob", "advantages", "response_mask", "ref_logprob")
    tensors = (old, adv, mask, ref_logp)

    def loss_of(rows: slice, num_tokens=None, num_seqs=None) -> torch.Tensor:
        batch = {name: t[rows] for name, t in zip(names, tensors, strict=True)}
        return grpo.actor_loss(
            logp[rows], batch, options, num_tokens, entropy[rows], num_seqs=num_seqs
        )[0]

    parts = [loss_of(slice(i, i + 5), mask.sum(), mask.any(-1).sum()) for i in (0, 5)]
    assert sum(parts).item() == pytest.approx(loss_of(slice(None)).item())
