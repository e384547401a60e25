"""benchmarks/env.py without training: its cells' configs, ratios and argument errors
(the figures themselves come from running it; README, Benchmarks)."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks import env as bench
from mindrl.config import load_config
from mindrl.data.records import PromptRecord
from mindrl.envs.base import call_env, make_env
from trainers.registry import get_algorithm


@pytest.mark.parametrize("mode", list(bench.MODES))
def test_every_cell_is_a_valid_run_of_the_recipe(mode):
    overrides = bench.cell_overrides(mode, 10.0, workers=2)
    config = load_config(
        bench.build_parser().parse_args([]).config, overrides, get_algorithm("grpo")
    )
    assert config.env.cls == f"benchmarks.harness.slow_env:{bench.MODES[mode]}"
    assert (config.env.kwargs, config.env.workers) == ({"delay_s": 0.01}, 2)


def test_slow_environments_overlap_their_waits_unless_one_at_a_time():
    record = PromptRecord(uid="u", text="next 1 =", answer="2")

    async def seconds_to_step(mode: str, episodes: int = 4) -> float:
        envs = [make_env(f"benchmarks.harness.slow_env:{bench.MODES[mode]}", {"delay_s": 0.2})
                for _ in range(episodes)]  # fmt: skip
        for env in envs:
            env.reset(record)
        start = time.perf_counter()
        await asyncio.gather(*(call_env(env.step, "1") for env in envs))
        return time.perf_counter() - start

    assert asyncio.run(seconds_to_step("async")) < 0.6
    assert asyncio.run(seconds_to_step("one-at-a-time")) >= 0.8


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
