"""benchmarks/env.py without training: its cells' configs, ratios and argument errors
(the figures themselves come from running it; docs/guide/benchmarks.md)."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks import env as bench
from mindrl.config import load_config
from mindrl.data.records import PromptRecord
from mindrl.envs import load_env_class, max_concurrent_steps
from mindrl.workers.env_worker import EnvWorker
from trainers.registry import get_algorithm


@pytest.mark.parametrize("mode", list(bench.MODES))
def test_every_cell_is_a_valid_run_of_the_recipe(mode):
    overrides = bench.cell_overrides(mode, 10.0, workers=2)
    config = load_config(
        bench.build_parser().parse_args([]).config, overrides, get_algorithm("grpo")
    )
    assert config.env.cls == f"benchmarks.harness.slow_env:{bench.MODES[mode]}"
    assert (config.env.kwargs, config.env.workers) == ({"delay_s": 0.01}, 2)


def test_only_the_one_at_a_time_environment_limits_its_worker_to_one_step():
    limits = {
        mode: max_concurrent_steps(load_env_class(path), path)
        for mode, path in ((m, f"benchmarks.harness.slow_env:{c}") for m, c in bench.MODES.items())
    }
    assert limits == {"async": None, "threads": None, "one-at-a-time": 1}


@pytest.mark.parametrize("mode", list(bench.MODES))
def test_every_step_spends_its_delay_inside_the_environment(mode):
    delay_s, episodes = 0.05, 4
    record = PromptRecord(uid="u", text="next 1 =", answer="2")

    async def step_all() -> tuple[float, list]:
        path = f"benchmarks.harness.slow_env:{bench.MODES[mode]}"
        worker = EnvWorker(0, 1, path, {"delay_s": delay_s})
        for key in range(episodes):
            await worker.reset(key, record)
        start = time.perf_counter()
        results = await asyncio.gather(*(worker.step(key, "1") for key in range(episodes)))
        return time.perf_counter() - start, results

    elapsed, results = asyncio.run(step_all())
    assert all(inside >= delay_s for *_, inside, _ in results)
    if mode == "one-at-a-time":  # the sleeps ran one after another
        assert elapsed >= episodes * delay_s


def test_ratios_compare_modes_at_one_delay_and_delays_within_one_mode():
    rows = [
        {"mode": "async", "delay_ms": 0.0, "episodes_per_s": 100.0},
        {"mode": "one-at-a-time", "delay_ms": 0.0, "episodes_per_s": 50.0},
        {"mode": "async", "delay_ms": 100.0, "episodes_per_s": 40.0},
        {"mode": "one-at-a-time", "delay_ms": 100.0, "episodes_per_s": 5.0},
    ]
    assert bench.ratios(rows) == {
        "async / one-at-a-time at 0 ms": 2.0,
        "async / one-at-a-time at 100 ms": 8.0,
        "async 100 ms / 0 ms": 0.4,
        "one-at-a-time 100 ms / 0 ms": 0.1,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--iterations", "1", "--warmup", "1"], "--iterations must exceed --warmup"),
        (["--delays-ms", "-5"], "--delays-ms must be >= 0"),
        (["--config", "no/such.yaml"], "is not a file"),
    ],
)
def test_bad_arguments_end_in_one_line_with_exit_2(argv, message, capsys):
    assert bench.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line
