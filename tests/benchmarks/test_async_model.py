"""The simulated cluster of benchmarks/async.py: its cost model behaves as stated.

No training runs here; the measured half of the benchmark needs Ray and minutes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

# ``async`` is a keyword, so the script is loaded from its path.
_spec = importlib.util.spec_from_file_location(
    "async_benchmark", Path(__file__).resolve().parents[2] / "benchmarks" / "async.py"
)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up while it loads
_spec.loader.exec_module(bench)

#: The paper's setup, shortened so the test is fast: fewer, shorter responses.
SMALL = bench.ClusterModel(prompts=32, response_mean=256.0, response_max=1024)


def test_streaming_hides_reward_behind_generation_and_changes_nothing_else():
    sim = bench.simulate(SMALL)["rows"]
    sync, stream = sim["sync"], sim["stream"]
    assert stream["iteration_s"] < sync["iteration_s"]
    hidden = sync["iteration_s"] - stream["iteration_s"]
    # What streaming saves is the reward time after generation, nothing more.
    assert hidden == pytest.approx(sync["reward_tail_s"] - stream["reward_tail_s"])
    assert sync["reward_tail_s"] == pytest.approx(sync["reward_busy_s"])
    for key in ("generation_s", "ref_logp_busy_s", "update_s", "dock_dispatch_s"):
        assert stream[key] == sync[key]


def test_without_reward_work_streaming_gains_nothing():
    sim = bench.simulate(dataclasses.replace(SMALL, reward_ms=0.0))["rows"]
    assert sim["stream"]["iteration_s"] == pytest.approx(sim["sync"]["iteration_s"])


def test_long_responses_finish_last_and_a_replica_decodes_until_its_longest():
    lengths = bench.response_lengths(SMALL)
    assert lengths.max() <= SMALL.response_max and lengths.min() >= 1
    ready = bench.generation_ready_times(SMALL, lengths, SMALL.devices)
    for replica in range(SMALL.devices):
        mine = np.arange(replica, len(lengths), SMALL.devices)
        order = np.argsort(lengths[mine], kind="stable")
        assert np.all(np.diff(ready[mine][order]) >= 0)


def test_the_partial_rollout_summary_gives_iteration_time_percentiles_and_trained_throughput():
    # Ten iterations of 1..10 s, two rounds each; the last trains nothing (at its cap).
    records = [
        {
            "iteration_time_s": float(t),
            "tps": 2.0,
            "reward_mean": 0.5,
            "trained_groups": 4,
            "generation_rounds": 2,
            "time": {"rollout": t / 2, "update": 0.25},
        }
        for t in range(1, 11)
    ]
    records[-1] |= {"tps": 0.0, "trained_groups": 0}
    summary = bench.summarize_partial(records, groups=4)
    assert (summary["p50_s"], summary["p90_s"], summary["max_s"]) == (5.5, 9.1, 10.0)
    assert summary["trained_tokens_per_s"] == pytest.approx(2.0 * 45 / 55)
    assert summary["trained_groups_per_s"] == pytest.approx(36 / 55)
    assert summary["groups_per_iteration"] == pytest.approx(3.6)
    assert summary["rounds_per_iteration"] == 2
    assert summary["stage_s"] == {"rollout": pytest.approx(2.75), "update": 0.25}
    # A whole-rollout record has no trained_groups: it trains every group in one round.
    keep = ("iteration_time_s", "tps", "reward_mean")
    whole = bench.summarize_partial([{k: records[0][k] for k in keep}], 4)
    assert (whole["groups_per_iteration"], whole["rounds_per_iteration"]) == (4, 1)
    assert whole["trained_groups_per_s"] == 4.0 and whole["stage_s"] == {}
