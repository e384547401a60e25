"""An offline trainer's config (DPO on stored pairs): what it does not read is refused with
the reason, and batch sizes that would split a pair are refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config import ConfigError, load_config
from trainers.registry import get_algorithm

TINY_DPO = Path(__file__).resolve().parents[2] / "configs" / "tiny_dpo.yaml"


def dpo_problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(TINY_DPO, list(overrides), algorithm=get_algorithm("dpo"))
    return [problem.removeprefix(f"{TINY_DPO}: ") for problem in err.value.problems]


def test_the_tiny_dpo_recipe_loads_with_dpo_defaults_and_pairs_from_the_tiny_task():
    config = load_config(TINY_DPO, algorithm=get_algorithm("dpo"))
    options = get_algorithm("dpo").resolve(config.algorithm)
    assert (options.dpo_beta, options.dpo_loss) == (0.1, "sigmoid")
    assert config.data.source == "synthetic:tiny" and config.actor.micro_batch_size % 2 == 0


def test_generation_and_reward_settings_are_refused_because_dpo_generates_nothing():
    problems = dpo_problems("rollout.temperature=0.7", "reward.workers=2", "dock.pipeline=stream")
    assert problems == [
        "rollout.temperature: --trainer dpo trains on stored pairs and generates nothing, so "
        "this setting has no effect; remove it",
        "reward.workers: --trainer dpo trains on stored pairs and scores nothing (a pair's "
        "preference is its label), so this setting has no effect; remove it",
        "dock.pipeline: stream overlaps scoring with generation and --trainer dpo generates "
        "nothing; remove it",
    ]


def test_responses_per_prompt_are_refused_because_a_pair_is_its_own_group():
    assert dpo_problems("data.n_samples_per_prompt=8") == [
        "data.n_samples_per_prompt: a pair's two responses are its group for --trainer dpo; "
        "remove it"
    ]


def test_a_policy_gradient_option_dpo_does_not_read_is_one_line_not_a_traceback():
    assert dpo_problems("algorithm.kl_coef=0.05") == [
        "algorithm.kl_coef: dpo does not read it (it reads only dpo_beta, dpo_loss), so it "
        "has no effect; remove it"
    ]
    (owned,) = dpo_problems("algorithm.dynamic_sampling=true")
    assert owned.startswith("algorithm.dynamic_sampling is a dapo feature; dpo does not use it")


def test_an_odd_micro_batch_would_split_a_pair_and_is_refused():
    assert dpo_problems("actor.micro_batch_size=5") == [
        "actor.micro_batch_size: 5 rows would split a pair (its chosen and rejected rows) over "
        "two micro-batches; use an even number"
    ]


def test_pairs_that_do_not_split_evenly_over_data_parallel_ranks_are_refused():
    tp1 = ("actor.parallel.tp=1", "reference.parallel.tp=1")  # DP 2
    assert dpo_problems(*tp1, "data.global_batch_size=15", "actor.mini_batch_size=5") == [
        "actor.mini_batch_size: 5 pairs per optimizer step cannot be split evenly over the "
        "actor's 2 data-parallel ranks"
    ]
    load_config(TINY_DPO, [*tp1, "data.global_batch_size=6"], algorithm=get_algorithm("dpo"))


def test_a_token_budget_could_part_a_pair_and_is_refused():
    assert dpo_problems("actor.max_tokens_per_micro_batch=512") == [
        "actor.max_tokens_per_micro_batch: 512 could cut a pair's chosen and rejected rows "
        "apart; pairs train by actor.micro_batch_size, remove it"
    ]
