"""The env.kind=embodied config section: what it loads, what it refuses at load and at
start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config import ConfigError, load_config
from trainers.driver.setup import RunSetupError, _preflight
from trainers.registry import get_algorithm

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
EMBODIED = ["env.kind=embodied", "env.cls=mindrl.envs.batched_reach:BatchedReach"]


def test_the_embodied_env_section_loads_without_a_trainer():
    env = load_config(TINY, [*EMBODIED, "env.num_envs=64", "env.kwargs.image_size=48"]).env
    assert env.embodied and not env.enabled  # not a text environment's multi-turn run
    assert (env.num_envs, env.chunk_size, env.horizon, env.auto_reset) == (64, 4, 12, True)
    assert env.kwargs == {"image_size": 48}
    assert load_config(TINY).env.kind == "text"


def test_a_trainer_on_an_embodied_env_with_a_text_model_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, EMBODIED, get_algorithm("grpo"))
    assert (
        f"{TINY}: env.kind=embodied trains a vision-language-action policy; set "
        "model.family=vla (got llama)"
    ) in err.value.problems


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.kind=embodied"], "env.kind=embodied needs env.cls, a VectorEnv subclass"),
        ([*EMBODIED, "env.chunk_size=5"], "env.chunk_size=5 does not divide env.horizon=12"),
        (["env.kind=embodied", "env.cls=reach.Reach"], "expected 'package.module:ClassName'"),
        ([*EMBODIED, "env.kind=robot"], "env.kind"),
        (
            [*EMBODIED, "algorithm.reward_level=action", "algorithm.logprob_level=chunk"],
            "algorithm.reward_level=action with algorithm.logprob_level=chunk: one chunk "
            "log-prob cannot carry an advantage per action; set algorithm.logprob_level to "
            "action or token",
        ),
        ([*EMBODIED, "algorithm.reward_level=token"], "algorithm.reward_level"),
        (
            ["env.clone_steps=100"],
            "env.clone_steps=100 clones a simulator's scripted expert: it needs "
            "env.kind=embodied; set env.clone_steps=0",
        ),
        (
            ["env.placement=hybrid"],
            "env.placement=hybrid / env.pipeline_stages=1 / env.device=cpu place",
        ),
        (["env.device=accelerator"], "env.device=accelerator place a simulator"),
        ([*EMBODIED, "env.placement=remote"], "env.placement"),
    ],
)
def test_a_malformed_embodied_section_is_refused_at_load(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides)
    assert any(message in problem for problem in err.value.problems)


def test_start_up_refuses_an_embodied_class_that_is_no_vector_env():
    config = load_config(TINY, ["env.kind=embodied", "env.cls=mindrl.envs.recall:RecallEnv"])
    with pytest.raises(RunSetupError, match=r"env\.kind=embodied needs a subclass of"):
        _preflight(config, offline=False)
    _preflight(load_config(TINY, EMBODIED), offline=False)  # a VectorEnv passes
