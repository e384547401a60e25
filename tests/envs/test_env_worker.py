"""The environment worker's step timing and step limit, on the worker class itself (no
Ray: its methods are coroutines, driven here by one event loop)."""

from __future__ import annotations

import asyncio
import time

import pytest

from mindrl.data import PromptRecord
from mindrl.envs import EnvConfigError
from mindrl.workers.env_worker import EnvWorker
from tests.envs import toy_envs
from trainers.driver.iteration import episode_metrics

RECORD = PromptRecord(uid="r0", text="next : 3 =", answer="4")
HOLD_S = 0.05


async def gated_steps(cls: type[toy_envs.Gated], episodes: int):
    """Start ``episodes`` steps, hold the gate shut for at least HOLD_S once every step has
    reached the worker, then open it; how many were inside at once while it was shut, how
    long it was shut, and each step's result."""
    cls.gate, cls.inside, cls.peak = asyncio.Event(), 0, 0
    worker = EnvWorker(0, 1, f"tests.envs.toy_envs:{cls.__name__}", {})
    for key in range(episodes):
        await worker.reset(key, RECORD)
    steps = [asyncio.create_task(worker.step(key, "1")) for key in range(episodes)]
    for _ in range(20):  # every task runs up to its first real wait
        await asyncio.sleep(0)
    inside_while_shut = cls.inside
    shut = time.perf_counter()
    await asyncio.sleep(HOLD_S)
    cls.gate.set()
    held = time.perf_counter() - shut
    return inside_while_shut, held, await asyncio.gather(*steps)


def test_a_step_waiting_for_its_turn_is_timed_apart_from_the_step():
    inside, held, results = asyncio.run(gated_steps(toy_envs.GatedOneAtATime, episodes=2))
    assert inside == 1 and toy_envs.GatedOneAtATime.peak == 1
    (*_, first_inside, first_queued), (*_, second_inside, second_queued) = results
    # The first step was inside the environment the whole time the gate was shut; the
    # second had reached the worker before it shut and could start only after it opened.
    assert first_inside >= held >= HOLD_S
    assert second_queued >= held
    assert first_queued >= 0.0 and second_inside >= 0.0


def test_without_a_limit_every_step_runs_at_once():
    inside, _, results = asyncio.run(gated_steps(toy_envs.Gated, episodes=3))
    assert inside == 3 and toy_envs.Gated.peak == 3
    assert [result[:3] for result in results] == [("", 1.0, True)] * 3
    assert all(inside_s >= HOLD_S for *_, inside_s, _ in results)


@pytest.mark.parametrize("limit", [0, -1, 1.5, "1", True])
def test_a_bad_step_limit_is_refused_when_the_worker_starts(limit, monkeypatch):
    monkeypatch.setattr(toy_envs.Gated, "max_concurrent_steps", limit, raising=False)
    with pytest.raises(EnvConfigError, match="max_concurrent_steps must be None or an integer"):
        EnvWorker(0, 1, "tests.envs.toy_envs:Gated", {})


def test_the_iteration_reports_the_mean_step_and_the_mean_wait_before_a_step():
    totals = {
        "env_episodes": 4.0, "env_turns": 8.0, "env_observation_tokens": 12.0,
        "env_steps": 8.0, "env_step_s": 0.8, "env_step_queue_s": 2.4,
        "env_wait_s": 1.0, "env_engine_s": 0.5,
        "env_truncated_max_turns": 1.0, "env_truncated_context": 0.0,
    }  # fmt: skip
    record = episode_metrics(totals, seconds=4.0)
    assert record["env_step_s_mean"] == pytest.approx(0.1)
    assert record["env_step_queue_s_mean"] == pytest.approx(0.3)
    assert record["env_wait_share"] == pytest.approx(0.25)


@pytest.mark.parametrize("stops", ["</calc>", ("",), (3,)])
def test_bad_stop_strings_are_refused_when_the_worker_starts(stops, monkeypatch):
    monkeypatch.setattr(toy_envs.StopsAtDigit, "stop_strings", stops)
    with pytest.raises(EnvConfigError, match="stop_strings must be a tuple of non-empty strings"):
        EnvWorker(0, 1, "tests.envs.toy_envs:StopsAtDigit", {})
