"""Multi-turn runs end to end on the shared cluster (docs/architecture.md §12):
one turn is today's single-turn run, a two-turn PPO run trains on its trajectories with
the observations masked, and an environment that raises ends the run in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config import load_config
from mindrl.metrics import measured, read_metrics
from tests.trainers.conftest import WITH_REFERENCE
from tests.trainers.test_pipeline import ONE_DEVICE, trained_records
from trainers.driver.train import train
from trainers.registry import get_algorithm

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

TINY_ENV = Path(__file__).resolve().parents[2] / "configs" / "tiny_env.yaml"
TOY = "tests.envs.toy_envs"


def outcomes(record: dict) -> dict:
    """Every number the samples decide (no timing, no memory, no episode figure, none of
    the reward functions' figures: an episode's reward is its environment's)."""
    return {
        k: v
        for k, v in measured.outcomes(record).items()
        if not k.startswith(("env_", "reward/", "reward_fn/"))
    }


def test_episodes_of_one_turn_are_the_single_turn_run_metric_for_metric(sync_records, tmp_path):
    # The environment scores the one turn with the synthetic verifier, as the reward
    # stage does: the same samples, rewards, advantages, losses and gradients.
    one_turn = trained_records(
        tmp_path, "grpo", *WITH_REFERENCE, f"env.cls={TOY}:OneShot", "env.max_turns=1"
    )
    assert [outcomes(r) for r in one_turn] == [outcomes(r) for r in sync_records]
    assert [r["env_turns_mean"] for r in one_turn] == [1.0, 1.0]
    assert all(r["env_observation_tokens_mean"] == 0.0 for r in one_turn)


def env_config(run_dir: Path, trainer: str, *overrides: str):
    return load_config(
        TINY_ENV,
        [
            f"logging.dir={run_dir / 'run'}",
            "logging.progress_bar=false",
            "logging.backends=[]",
            "checkpoint.every=0",
            "iterations=2",
            *overrides,
        ],
        algorithm=get_algorithm(trainer),
    )


def test_ppo_trains_on_two_turn_trajectories_scored_as_they_were_sampled(tmp_path):
    assert train(env_config(tmp_path, "ppo", *ONE_DEVICE), "ppo", "cpu") == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 2
    for record in records:
        # Every episode that goes on hears "copy S =" (3 tokens) and takes a second turn.
        assert 1.0 <= record["env_turns_mean"] <= 2.0
        assert record["env_observation_tokens_mean"] == pytest.approx(
            3.0 * (record["env_turns_mean"] - 1.0)
        )
        assert 0.0 <= record["reward_mean"] <= 1.0 and record["env_truncated_context"] == 0
        assert 0.0 < record["env_wait_share"] < 1.0 and record["env_engine_s"] > 0
        # The training forward scores the model's tokens of each trajectory exactly as the
        # engine sampled them: the mask lines up with the tokens, observations and all.
        assert record["rollout_logprob_diff"] < 1e-4
        assert record["critic_value_mean"] == record["critic_value_mean"]  # trained, finite


def test_an_environment_that_raises_ends_the_run_in_one_line_naming_it(tmp_path, capsys):
    config = env_config(tmp_path, "grpo", f"env.cls={TOY}:Raises", "env.kwargs={}", *ONE_DEVICE)
    assert train(config, "grpo", "cpu") == 1
    err = capsys.readouterr().err
    # The failure's line, then where its details are (every failed run's second line).
    errors = [line for line in err.splitlines() if line.startswith("mindrl-train: error:")]
    assert len(errors) == 2 and errors[1].startswith("mindrl-train: error: details in"), err
    assert f"environment {TOY}:Raises raised in step (ValueError: the tool crashed)" in errors[0]
    assert "on the episode whose prompt is '" in errors[0]
