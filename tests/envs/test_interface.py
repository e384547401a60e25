"""The environment interface: the loader, the env config section and its refusals."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from mindrl.config import ConfigError, load_config
from mindrl.data import PromptRecord
from mindrl.envs import (
    EnvConfigError,
    EnvironmentFailed,
    call_env,
    checked_reset,
    checked_step,
    load_env_class,
    make_env,
)
from trainers.registry import get_algorithm

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
USER_ENV = """
import asyncio

class Echo:
    def __init__(self, prefix="you said "):
        self.prefix = prefix
    def reset(self, record):
        return record.text
    def step(self, action):
        return self.prefix + action, 1.0, action == "stop"

class AsyncEcho:
    async def reset(self, record):
        return "task: " + record.text
    async def step(self, action):
        await asyncio.sleep(0)
        return action.upper(), 0.5, True

class NoStep:
    def reset(self, record):
        return ""
"""
RECORD = PromptRecord(uid="r0", text="2+2=", answer="4")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of the user's own, importable only from a folder put on PYTHONPATH."""
    (tmp_path / "my_envs.py").write_text(textwrap.dedent(USER_ENV))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_envs"


def test_a_class_from_the_users_own_module_is_loaded_and_built_with_the_kwargs(user_module):
    env = make_env(f"{user_module}:Echo", {"prefix": "> "})
    assert checked_reset(env.reset(RECORD), "x") == "2+2="
    assert checked_step(env.step("4"), "x") == ("> 4", 1.0, False)
    assert load_env_class(f"{user_module}:AsyncEcho").__name__ == "AsyncEcho"


def test_sync_methods_run_on_a_thread_and_async_ones_are_awaited(user_module):
    sync_env = make_env(f"{user_module}:Echo", {})
    async_env = make_env(f"{user_module}:AsyncEcho", {})

    async def episode(env):
        start = await call_env(env.reset, RECORD)
        return start, await call_env(env.step, "stop")

    assert asyncio.run(episode(sync_env)) == ("2+2=", ("you said stop", 1.0, True))
    assert asyncio.run(episode(async_env)) == ("task: 2+2=", ("STOP", 0.5, True))


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("my_envs.Echo", "expected 'package.module:ClassName'"),
        ("no_such_module_here:Echo", "cannot import 'no_such_module_here'"),
        ("{module}:Missing", "has no class 'Missing'"),
        ("{module}:NoStep", "the class has no step method"),
    ],
)
def test_a_class_that_cannot_be_loaded_is_refused_in_one_line(user_module, path, says):
    with pytest.raises(EnvConfigError) as err:
        load_env_class(path.format(module=user_module))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_module_whose_package_is_missing_is_refused_with_its_own_install_line(
    tmp_path, monkeypatch
):
    (tmp_path / "guarded_envs.py").write_text(
        "raise ImportError('guarded_envs needs simpkg: pip install simpkg', name='simpkg')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvConfigError) as err:
        load_env_class("guarded_envs:Env")
    assert str(err.value) == (
        "env.cls 'guarded_envs:Env': guarded_envs needs simpkg: pip install simpkg"
    )


def test_kwargs_the_class_refuses_are_named(user_module):
    with pytest.raises(EnvConfigError, match=r"refuses env.kwargs \{'size': 3\}"):
        make_env(f"{user_module}:Echo", {"size": 3})


@pytest.mark.parametrize(
    "result", [("obs", 1.0), ("obs", "1", False), (3, 1.0, False), None, ("obs", True, False)]
)
def test_a_step_that_returns_something_else_fails_naming_the_class(result):
    with pytest.raises(EnvironmentFailed, match="environment pkg:Env: step must return"):
        checked_step(result, "pkg:Env")


def test_the_env_section_loads_with_kwargs_and_overrides():
    config = load_config(
        TINY,
        ["env.cls=my_envs:Echo", "env.kwargs.prefix=hi", "env.max_turns=3", "env.workers=2"],
        get_algorithm("grpo"),
    )
    env = config.env
    assert env.enabled and (env.cls, env.kwargs, env.max_turns, env.workers) == (
        "my_envs:Echo",
        {"prefix": "hi"},
        3,
        2,
    )
    assert env.max_turn_tokens is None
    assert not load_config(TINY).env.enabled  # no env section: single-turn


def problems(overrides, trainer="grpo"):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides, get_algorithm(trainer))
    return err.value.problems


def test_a_malformed_env_section_is_refused_with_the_fix():
    found = problems(["env.kwargs=3"])
    assert any("env.kwargs: expected a mapping of names to values, got 3" in p for p in found)
    found = problems(["env.cls=my_envs.Echo", "env.max_turn_tokens=100"])
    assert any("expected 'package.module:ClassName'" in p for p in found)
    assert any("env.max_turn_tokens=100 exceeds rollout.max_response_length=" in p for p in found)


@pytest.mark.parametrize(
    ("overrides", "trainer", "other"),
    [
        (["rollout.partial_rollout_budget=2"], "grpo", "rollout.partial_rollout_budget=2"),
        (
            ["rollout.placement=disaggregated", "rollout.devices=1"],
            "grpo",
            "rollout.placement: disaggregated",
        ),
        ([], "dapo", "dynamic sampling (DAPO)"),
        (["data.val_every=5", "data.val_source=synthetic:tiny"], "grpo", "validation"),
    ],
)
def test_combinations_not_supported_with_an_environment_are_refused_in_one_line(
    overrides, trainer, other
):
    found = problems(["env.cls=my_envs:Echo", *overrides], trainer)
    line = f"env.cls 'my_envs:Echo' (multi-turn) with {other}"
    hits = [p for p in found if line in p]
    assert len(hits) == 1, found
    assert hits[0].endswith("is not yet supported; remove the env section for it")
