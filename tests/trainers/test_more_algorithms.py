"""RLOO, GSPO, REINFORCE++, PF-PPO and DPO maths against float64 loop references."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from backends.megatron import GlobalCounts, ResponseBatch
from mindrl.algorithm import run_options
from mindrl.config import MindRLConfig
from mindrl.config.validate import validate_config
from mindrl.data.pairs import load_preference_pairs, make_digit_pairs
from mindrl.data.sources import PromptSourceError
from mindrl.metrics import mean_by_key
from mindrl.run_plan import build_run_plan
from mindrl.workers.context import stage_context
from mindrl.workers.updates import actor_update
from tests.trainers import loop_reference as ref
from tests.trainers.batches import random_inputs
from trainers.core import policy_loss
from trainers.dpo import preference_loss, sequence_logprob
from trainers.gspo import sequence_level_old_logprob, sequence_log_ratio
from trainers.pf_ppo import filter_by_reward, filtered_gae
from trainers.registry import get_algorithm
from trainers.reinforce_pp import kl_shaped_rewards, reinforce_pp_advantages
from trainers.rloo import leave_one_out_advantages

# Interleaved groups, a group of one (id 9) and a group whose rewards are all equal (id 4).
GROUP_IDS = [7, 3, 7, 3, 9, 7, 4, 3, 4, 7]
NEW = ["pf_ppo", "reinforce_pp", "rloo", "gspo", "dr_grpo"]


def as64(nested: list) -> torch.Tensor:
    return torch.tensor(nested, dtype=torch.float64)


# ---- RLOO ---------------------------------------------------------------------------------
def test_rloo_subtracts_the_mean_of_the_other_responses_of_each_group():
    mask, (rewards,) = random_inputs(10, count=1)
    got, scores = leave_one_out_advantages(rewards, mask, torch.tensor(GROUP_IDS))
    torch.testing.assert_close(got, as64(ref.rloo(rewards, mask, GROUP_IDS)))
    assert scores[4].item() == pytest.approx(float((rewards[4] * mask[4]).sum()))


def test_rloo_gives_a_group_of_one_its_own_score_and_scales_grpo_by_k_over_k_minus_one():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5])  # group "a" of 4, group "b" of 1
    adv, _ = leave_one_out_advantages(scores[:, None], torch.ones(5, 1), list("aaaab"))
    # k/(k-1) * (s - mean) = 4/3 * (1 - 0.25) = 1 for the winner, 4/3 * -0.25 for the rest.
    assert adv.squeeze(-1).tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 0.5])


# ---- GSPO ---------------------------------------------------------------------------------
def gspo_inputs(seed: int):
    mask, (old, logp, adv) = random_inputs(seed, count=3)
    old, logp = old * 0.3 - 1, logp * 0.3 - 1
    # One advantage per sequence, as GRPO makes them.
    adv = torch.where(mask.bool(), adv[:, :1], 0.0)
    return mask, old, logp, adv


@pytest.mark.parametrize(("clip_low", "clip_high"), [(0.2, 0.2), (0.05, 0.08), (3e-4, 4e-4)])
def test_gspo_loss_clips_the_length_normalised_sequence_ratio(clip_low, clip_high):
    mask, old, logp, adv = gspo_inputs(11)
    seq_old = sequence_level_old_logprob(logp, old, mask)
    loss, metrics = policy_loss(
        seq_old, logp, adv, mask, clip_low, clip_high, None, "seq-mean-token-mean"
    )
    assert loss.item() == pytest.approx(ref.gspo_loss(old, logp, adv, mask, clip_low, clip_high))
    # Every token of a sequence carries its sequence's ratio, so clipping is per sequence.
    flags = (logp - seq_old).exp()
    for row, valid in zip(flags, mask.bool(), strict=True):
        assert torch.allclose(row[valid], row[valid][:1].expand(int(valid.sum())))
    assert 0.0 < metrics["clip_fraction"].item() < 1.0


def test_gspo_gradient_is_the_sequence_ratio_times_the_mean_token_score():
    mask, old, logp, adv = gspo_inputs(12)
    logp.requires_grad_()
    loss, _ = policy_loss(
        sequence_level_old_logprob(logp, old, mask),
        logp,
        adv,
        mask,
        0.999,
        1e3,
        None,
        "seq-mean-token-mean",
    )
    loss.backward()
    # Unclipped (wide clip): d/dlogp_it of -1/G sum_i A_i s_i = -A_i s_i / (|y_i| G).
    s = sequence_log_ratio(logp.detach(), old, mask).exp()
    length = mask.sum(-1).clamp(min=1)
    sequences = int(mask.any(-1).sum())
    per_sequence = adv.sum(-1) / length  # the one advantage of each sequence
    want = torch.where(mask.bool(), -(per_sequence * s / length)[:, None] / sequences, 0.0)
    torch.testing.assert_close(logp.grad, want)


# ---- REINFORCE++ --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kl_coef", "kind", "gamma"), [(0.0, "k1", 1.0), (0.1, "k1", 1.0), (0.05, "k3", 0.9)]
)
def test_reinforce_pp_whitens_the_kl_shaped_reward_to_go_over_the_batch(kl_coef, kind, gamma):
    mask, (rewards, old, ref_logp) = random_inputs(13, count=3)
    shaped = kl_shaped_rewards(rewards, old, ref_logp, mask, kl_coef, kind)
    adv, _ = reinforce_pp_advantages(shaped, mask, gamma)
    want = ref.reinforce_pp(rewards, old, ref_logp, mask, kl_coef, kind, gamma)
    torch.testing.assert_close(adv, as64(want))


def test_reinforce_pp_puts_the_kl_penalty_on_every_response_token():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    old, ref_logp = torch.tensor([[-1.0, -2.0, 5.0]]), torch.tensor([[-1.5, -1.0, 0.0]])
    shaped = kl_shaped_rewards(torch.tensor([[0.0, 1.0, 0.0]]), old, ref_logp, mask, 0.1, "k1")
    assert shaped[0].tolist() == pytest.approx([-0.05, 1.1, 0.0])


# ---- PF-PPO -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["best", "worst", "both"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 1.0])
def test_pf_filter_keeps_the_ranked_ends_of_each_group(mode, ratio):
    generator = torch.Generator().manual_seed(14)
    scores = torch.randint(0, 4, (10,), generator=generator).double()  # with ties
    got = filter_by_reward(scores, torch.tensor(GROUP_IDS), ratio, mode)
    assert got.tolist() == ref.pf_filter(scores, GROUP_IDS, ratio, mode)


def test_pf_filter_best_worst_and_both_on_one_group():
    scores, ids = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.7, 0.2]), [0] * 6
    best = filter_by_reward(scores, ids, 0.5, "best").nonzero().squeeze(-1).tolist()
    worst = filter_by_reward(scores, ids, 0.5, "worst").nonzero().squeeze(-1).tolist()
    both = filter_by_reward(scores, ids, 0.5, "both").nonzero().squeeze(-1).tolist()
    assert (best, worst, both) == ([1, 3, 4], [0, 2, 5], [1, 2, 4])


def test_pf_filter_refuses_an_unknown_mode_and_a_ratio_outside_zero_one():
    with pytest.raises(ValueError, match="unknown PF-PPO filter mode 'top'; known: best, worst"):
        filter_by_reward(torch.ones(2), [0, 0], 0.5, "top")
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\], got 0.0"):
        filter_by_reward(torch.ones(2), [0, 0], 0.0, "best")


def test_pf_ppo_advantages_are_gae_whitened_over_the_kept_responses_only():
    mask, (rewards, values) = random_inputs(15, count=2)
    keep = torch.tensor([True, False] * 5)
    adv, returns = filtered_gae(rewards, values, mask, keep, 0.99, 0.9)
    kept_mask = mask * keep[:, None]
    want_adv, _ = ref.gae(rewards, values, kept_mask, 0.99, 0.9)
    _, want_returns = ref.gae(rewards, values, mask, 0.99, 0.9)
    torch.testing.assert_close(adv, as64(want_adv))
    torch.testing.assert_close(returns, as64(want_returns))  # the critic sees every response
    assert adv[~keep].abs().sum() == 0


# ---- DPO ----------------------------------------------------------------------------------
def dpo_inputs(seed: int, pairs: int = 6):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, pairs, generator=generator, dtype=torch.float64) * 2 - 5


@pytest.mark.parametrize(("beta", "loss_type"), [(0.1, "sigmoid"), (0.5, "sigmoid"), (0.1, "ipo")])
def test_dpo_loss_and_preference_accuracy_match_the_loop(beta, loss_type):
    chosen, rejected, ref_chosen, ref_rejected = dpo_inputs(16)
    loss, metrics = preference_loss(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type)
    want_loss, want_accuracy = ref.dpo(
        chosen.tolist(), rejected.tolist(), ref_chosen.tolist(), ref_rejected.tolist(), beta,
        loss_type,
    )  # fmt: skip
    assert loss.item() == pytest.approx(want_loss)
    assert metrics["preference_accuracy"].item() == pytest.approx(want_accuracy)
    chosen_reward = beta * (chosen - ref_chosen)
    rejected_reward = beta * (rejected - ref_rejected)
    assert metrics["reward_margin"].item() == pytest.approx(
        (chosen_reward - rejected_reward).mean().item()
    )
    assert metrics["chosen_reward"].item() == pytest.approx(chosen_reward.mean().item())


def test_dpo_micro_batch_losses_with_the_global_pair_count_sum_to_the_full_batch():
    chosen, rejected, ref_chosen, ref_rejected = dpo_inputs(17, pairs=8)
    full, _ = preference_loss(chosen, rejected, ref_chosen, ref_rejected, 0.2)
    parts = [
        preference_loss(chosen[s], rejected[s], ref_chosen[s], ref_rejected[s], 0.2, num_pairs=8)[0]
        for s in (slice(0, 3), slice(3, 8))
    ]
    assert sum(parts).item() == pytest.approx(full.item())


class MicroBatchingEngine:
    """The training engine as ``actor_update`` sees it: it cuts one data-parallel rank's
    rows into micro-batches (the last one shorter) and hands each to the loss with the
    global counts; the policy's log-probs ride in the rows as the field ``policy``."""

    lora = None  # full weights

    def __init__(self, global_rows: int, dp_size: int) -> None:
        self.global_rows, self.dp_size = global_rows, dp_size

    def data_parallel_size(self) -> int:
        return self.dp_size

    def train_step(self, batch: ResponseBatch, loss_fn, micro_batching, with_entropy):
        counts = GlobalCounts(tokens=float(self.global_rows), sequences=self.global_rows)
        for micro in batch.split(micro_batching.size):
            policy = micro.fields["policy"]
            loss_fn({"logprobs": policy, "entropy": torch.zeros_like(policy)}, micro, counts)
        tokens = float(batch.input_ids.numel())  # no padding: every position computed is real
        return {"loss": 0.0, "computed_tokens": tokens, "real_tokens": tokens}


def dpo_rank_update(pairs: list[tuple[float, float]], total_pairs: int, dp_size: int) -> dict:
    """``actor_update`` of one DP rank on ``pairs`` (policy log-probs of the chosen and
    the rejected one-token response; the reference's are 0), 4 rows per micro-batch."""
    policy = as64([[logp] for pair in pairs for logp in pair])
    rows = ResponseBatch(
        torch.zeros(len(policy), 2, dtype=torch.long),
        torch.ones(len(policy), dtype=torch.long),
        torch.ones_like(policy),
        {"policy": policy, "ref_logprob": torch.zeros_like(policy)},
    )
    dpo, config = get_algorithm("dpo"), MindRLConfig()
    context = stage_context(build_run_plan(dpo, config), "actor", config, dpo)
    worker = SimpleNamespace(
        algorithm=dpo, options=dpo.resolve(), context=context, role="actor",
        section=SimpleNamespace(ppo_epochs=1, micro_batch_size=4, max_tokens_per_micro_batch=None),
        engine=MicroBatchingEngine(2 * total_pairs, dp_size),
    )  # fmt: skip
    return actor_update(worker, rows, num_minibatches=1)


def test_dpo_metrics_are_the_count_over_every_pair_whatever_the_micro_batch_and_rank_sizes():
    # Rank 0: micro-batches of 2 pairs (both right) and 1 pair (wrong); rank 1: 2 pairs
    # (one right). A mean of micro-batch means would say 0.5; 3 of the 5 pairs are right.
    rank0 = [(-1.0, -2.0), (-1.0, -3.0), (-2.0, -1.0)]
    rank1 = [(-0.5, -1.5), (-3.0, -1.0)]
    reports = [dpo_rank_update(pairs, total_pairs=5, dp_size=2) for pairs in (rank0, rank1)]
    iteration = mean_by_key(reports)  # as the driver reduces the ranks' reports
    pairs, beta = rank0 + rank1, 0.1
    assert iteration["preference_accuracy"] == pytest.approx(3 / 5, rel=1e-12)
    margins = [beta * (chosen - rejected) for chosen, rejected in pairs]
    assert iteration["reward_margin"] == pytest.approx(sum(margins) / 5, rel=1e-12)  # 0.02
    chosen_mean = beta * sum(chosen for chosen, _ in pairs) / 5
    assert iteration["chosen_reward"] == pytest.approx(chosen_mean, rel=1e-12)  # -0.15
    rejected_mean = beta * sum(rejected for _, rejected in pairs) / 5
    assert iteration["rejected_reward"] == pytest.approx(rejected_mean, rel=1e-12)  # -0.17


def test_dpo_loss_is_finite_for_a_huge_wrong_margin_and_refuses_bad_options():
    zero = torch.zeros(1, dtype=torch.float64)
    loss, _ = preference_loss(zero - 5000, zero, zero, zero, 1.0)
    assert loss.item() == pytest.approx(5000.0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        preference_loss(zero, zero, zero, zero, 0.0)
    with pytest.raises(ValueError, match="unknown DPO loss 'hinge'; known: sigmoid, ipo"):
        preference_loss(zero, zero, zero, zero, 0.1, "hinge")


def test_sequence_logprob_sums_the_response_tokens_only():
    logprob = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    assert sequence_logprob(logprob, mask).tolist() == [-3.0, -1.0]


# ---- Preference pairs ---------------------------------------------------------------------
def test_tiny_pairs_prefer_the_right_answer_over_one_changed_digit():
    pairs = make_digit_pairs("tiny", 50, seed=3)
    assert pairs == make_digit_pairs("tiny", 50, seed=3) != make_digit_pairs("tiny", 50, seed=4)
    for pair in pairs:
        last = int(pair.prompt.split()[-2])
        assert pair.chosen == str((last + 1) % 10) != pair.rejected
    reverse = make_digit_pairs("tiny-reverse", 20, seed=3)
    for pair in reverse:
        chosen, rejected = pair.chosen.split(), pair.rejected.split()
        assert sum(c != r for c, r in zip(chosen, rejected, strict=True)) == 1


def test_pairs_load_from_jsonl_and_name_the_line_that_lacks_a_field(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n\n{"prompt": "q"}\n')
    with pytest.raises(PromptSourceError, match=r"pairs.jsonl:3: no field 'chosen'"):
        load_preference_pairs(str(path))
    path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b", "x": 1}\n')
    (pair,) = load_preference_pairs(str(path))
    assert (pair.prompt, pair.chosen, pair.rejected) == ("p", "a", "b")
    with pytest.raises(PromptSourceError, match="no preference pairs for task 'math'"):
        load_preference_pairs("synthetic:math")


# ---- The algorithm objects: defaults, refusals, advantages and losses --------------------
def test_each_new_trainer_resolves_its_papers_defaults():
    resolved = {name: get_algorithm(name).resolve() for name in NEW}
    assert (resolved["gspo"].clip_low, resolved["gspo"].clip_high) == (3e-4, 4e-4)
    assert resolved["gspo"].loss_agg_mode == "seq-mean-token-mean"
    assert not resolved["dr_grpo"].norm_adv_by_std
    assert resolved["dr_grpo"].loss_agg_mode == "seq-mean-token-sum-norm"
    assert (resolved["pf_ppo"].pf_filter_ratio, resolved["pf_ppo"].pf_filter_mode) == (0.5, "both")
    assert resolved["pf_ppo"].lam == get_algorithm("ppo").resolve().lam
    assert all(options.kl_coef == 0.0 for name, options in resolved.items() if name != "pf_ppo")


def test_options_only_another_trainer_reads_are_refused_naming_the_owner():
    with pytest.raises(ValueError, match=r"algorithm\.pf_filter_ratio is a pf_ppo feature; ppo"):
        get_algorithm("ppo").resolve({"pf_filter_ratio": 0.25})
    with pytest.raises(ValueError, match=r"algorithm\.pf_filter_mode is a pf_ppo feature; grpo"):
        get_algorithm("grpo").resolve({"pf_filter_mode": "best"})
    with pytest.raises(ValueError, match=r"algorithm\.dpo_beta is a dpo feature; rloo"):
        get_algorithm("rloo").resolve({"dpo_beta": 0.1})
    with pytest.raises(ValueError, match=r"gspo averages one clipped sequence ratio"):
        get_algorithm("gspo").resolve({"loss_agg_mode": "token-mean"})
    with pytest.raises(ValueError, match=r"reinforce_pp puts the KL penalty in the reward"):
        get_algorithm("reinforce_pp").resolve({"kl_coef": 0.01, "adaptive_kl": True})
    explicit = get_algorithm("pf_ppo").resolve({"pf_filter_ratio": 0.25, "pf_filter_mode": "best"})
    assert (explicit.pf_filter_ratio, explicit.pf_filter_mode) == (0.25, "best")


def test_the_trainers_advantages_are_their_loop_references():
    mask, (rewards, values) = random_inputs(18, count=2)
    batch = {"token_rewards": rewards, "response_mask": mask, "group_ids": GROUP_IDS}
    batch["values"] = values

    def advantages(name: str, **options) -> torch.Tensor:
        algo = get_algorithm(name)
        return algo.compute_advantages(batch, algo.resolve(options))["advantages"]

    torch.testing.assert_close(advantages("rloo"), as64(ref.rloo(rewards, mask, GROUP_IDS)))
    dr = ref.grpo(rewards, mask, GROUP_IDS, norm_by_std=False)
    torch.testing.assert_close(advantages("dr_grpo"), as64(dr))
    torch.testing.assert_close(advantages("gspo"), as64(ref.grpo(rewards, mask, GROUP_IDS)))
    zeros = torch.zeros_like(rewards)
    want = ref.reinforce_pp(rewards, zeros, zeros, mask, 0.0, "k1", 0.9)
    torch.testing.assert_close(advantages("reinforce_pp", gamma=0.9), as64(want))
    scores = (rewards * mask).sum(-1)
    keep = torch.tensor(ref.pf_filter(scores, GROUP_IDS, 0.5, "best"))
    want, _ = ref.gae(
        rewards, values, mask * keep[:, None], 1.0, 1.0
    )  # pf_ppo: PPO defaults, lam 1
    got = advantages("pf_ppo", pf_filter_mode="best")
    torch.testing.assert_close(got, as64(want))


def test_dr_grpo_loss_sums_each_response_and_divides_by_one_constant():
    mask, (old, logp, adv) = random_inputs(19, count=3)
    old, logp = old * 0.2 - 1, logp * 0.2 - 1
    dr = get_algorithm("dr_grpo")
    batch = {"old_logprob": old, "advantages": adv, "response_mask": mask}
    loss, _ = dr.actor_loss(logp, batch, dr.resolve())
    want, *_ = ref.policy_loss(old, logp, adv, mask, 0.2, 0.2, 3.0, "seq-mean-token-sum-norm")
    assert loss.item() == pytest.approx(want)
    # A response twice as long with the same per-token loss weighs twice as much.
    short = {
        **batch,
        "response_mask": torch.tensor([[1.0, 0, 0, 0]]),
        "advantages": -torch.ones(1, 4),
    }
    long = {**short, "response_mask": torch.tensor([[1.0, 1, 0, 0]])}
    zero = torch.zeros(1, 4, dtype=torch.float64)
    ratio = (
        dr.actor_loss(zero, {**long, "old_logprob": zero}, dr.resolve())[0]
        / (dr.actor_loss(zero, {**short, "old_logprob": zero}, dr.resolve())[0])
    )
    assert ratio.item() == pytest.approx(2.0)


def test_dr_grpo_divides_by_the_generation_budget_whatever_width_the_batch_is_padded_to():
    config = MindRLConfig()
    config.rollout.max_response_length = 12
    dr = get_algorithm("dr_grpo")
    options = run_options(dr, config)
    assert options.norm_len == 12
    assert run_options(get_algorithm("grpo"), config).norm_len is None  # token-mean
    mask, (old, logp, adv) = random_inputs(24, count=3)  # 8 columns wide
    old, logp = old * 0.2 - 1, logp * 0.2 - 1
    batch = {"old_logprob": old, "advantages": adv, "response_mask": mask}
    want, *_ = ref.policy_loss(
        old, logp, adv, mask, 0.2, 0.2, 3.0, "seq-mean-token-sum-norm", norm_len=12
    )
    assert dr.actor_loss(logp, batch, options)[0].item() == pytest.approx(want)
    wider = {name: torch.nn.functional.pad(value, (0, 3)) for name, value in batch.items()}
    padded_logp = torch.nn.functional.pad(logp, (0, 3))
    assert dr.actor_loss(padded_logp, wider, options)[0].item() == pytest.approx(want)
    with pytest.raises(ValueError, match=r"algorithm\.norm_len: only seq-mean-token-sum-norm"):
        get_algorithm("grpo").resolve({"norm_len": 4})


def test_gspo_loss_is_the_sequence_objective_and_its_kl_reads_the_token_log_probs():
    mask, old, logp, adv = gspo_inputs(20)
    ref_logp = logp + 0.1
    gspo = get_algorithm("gspo")
    options = gspo.resolve({"kl_coef": 0.05, "kl_kind": "k1", "clip_c": None})
    batch = {"old_logprob": old, "advantages": adv, "response_mask": mask, "ref_logprob": ref_logp}
    loss, metrics = gspo.actor_loss(logp, batch, options, num_seqs=int(mask.any(-1).sum()))
    pg = ref.gspo_loss(old, logp, adv, mask, 3e-4, 4e-4)
    assert metrics["pg_loss"].item() == pytest.approx(pg)
    assert metrics["kl"].item() == pytest.approx(-0.1)
    assert loss.item() == pytest.approx(pg + 0.05 * -0.1)


def test_reinforce_pp_adds_no_kl_to_the_loss_even_with_a_coefficient_handed_in():
    mask, (logp, adv, ref_logp) = random_inputs(21, count=3)
    rpp = get_algorithm("reinforce_pp")
    options = dataclasses.replace(rpp.resolve(), kl_coef=0.5)  # e.g. a controller's value
    batch = {"advantages": adv, "response_mask": mask, "ref_logprob": ref_logp}
    loss, metrics = rpp.actor_loss(logp, batch, options)
    assert loss.item() == pytest.approx(-ref.masked_mean(adv, mask)) and "kl" not in metrics


def test_dpo_trains_on_consecutive_chosen_rejected_rows_against_the_reference():
    mask, (logp, ref_logp) = random_inputs(22, batch=8, count=2)
    mask[:, 0] = 1.0  # every response has a token
    dpo = get_algorithm("dpo")
    options = dpo.resolve({"dpo_beta": 0.2})
    loss, metrics = dpo.actor_loss(logp, {"response_mask": mask, "ref_logprob": ref_logp}, options)
    seq, ref_seq = (logp * mask).sum(-1).tolist(), (ref_logp * mask).sum(-1).tolist()
    want_loss, want_accuracy = ref.dpo(
        seq[0::2], seq[1::2], ref_seq[0::2], ref_seq[1::2], 0.2, "sigmoid"
    )
    assert loss.item() == pytest.approx(want_loss)
    assert metrics["preference_accuracy"].item() == pytest.approx(want_accuracy)
    assert (dpo.resolve().dpo_beta, dpo.resolve().dpo_loss) == (0.1, "sigmoid")
    assert dpo.uses_reference(options)
    halves = [
        dpo.actor_loss(logp[s], {"response_mask": mask[s], "ref_logprob": ref_logp[s]}, options,
                       num_seqs=8)[0]
        for s in (slice(0, 4), slice(4, 8))
    ]  # fmt: skip
    assert sum(halves).item() == pytest.approx(want_loss)  # num_seqs rows = num_seqs / 2 pairs
    with pytest.raises(ValueError, match="dpo needs whole pairs per micro-batch, got 3 rows"):
        dpo.actor_loss(logp[:3], {"response_mask": mask[:3], "ref_logprob": ref_logp[:3]}, options)


def test_the_config_check_runs_dpo_on_defaults_and_refuses_a_generation_setting_it_ignores():
    assert validate_config(MindRLConfig(), get_algorithm("dpo")) == []
    config = MindRLConfig()
    config.rollout.temperature = 0.5
    assert validate_config(config, get_algorithm("dpo")) == [
        "rollout.temperature: --trainer dpo trains on stored pairs and generates nothing, so "
        "this setting has no effect; remove it"
    ]
    assert validate_config(config, get_algorithm("rloo")) == []  # rloo samples with it


def test_reinforce_pp_with_kl_reads_reference_and_rollout_log_probs_at_the_advantage_stage():
    rpp = get_algorithm("reinforce_pp")
    config = MindRLConfig()
    config.algorithm.kl_coef = 0.05
    plan = build_run_plan(rpp, config)
    assert plan.needs_reference and "ref_logp" in plan.stage_names
    assert plan.stage("advantage").reads[-2:] == ("ref_logprob", "rollout_logprob")
    assert "ref_logprob" not in build_run_plan(rpp, MindRLConfig()).stage("advantage").reads
    mask, (rewards, rollout, ref_logp) = random_inputs(23, count=3)
    batch = {"token_rewards": rewards, "response_mask": mask, "rollout_logprob": rollout}
    batch["ref_logprob"] = ref_logp
    options = rpp.resolve({"kl_coef": 0.05, "kl_kind": "k1"})
    got = rpp.compute_advantages(batch, options)["advantages"]
    want = ref.reinforce_pp(rewards, rollout, ref_logp, mask, 0.05, "k1", 1.0)
    torch.testing.assert_close(got, as64(want))
