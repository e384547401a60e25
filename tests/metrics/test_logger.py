"""Metrics logger: JSONL round trip, TensorBoard scalars, resume truncation."""

from __future__ import annotations

import json

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mindrl.metrics import MetricsLogger, flatten_scalars, read_metrics


def _record(iteration):
    return {
        "reward_mean": 0.1 * iteration,
        "kl": torch.tensor(0.5 * iteration),
        "entropy": np.float32(1.25),
        "time": {"rollout": 2.0, "update": 1.5},
        "note": "text is kept in JSON only",
    }


def test_jsonl_round_trips_one_line_per_iteration_and_is_flushed_each_time(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, _record(1))
    # Flushed before close: a crashed run keeps what it logged.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["reward_mean"] == 0.1
    logger.log(2, _record(2))
    logger.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [1, 2]
    assert records[1] == {
        "iteration": 2,
        "reward_mean": 0.2,
        "kl": 1.0,
        "entropy": 1.25,
        "time": {"rollout": 2.0, "update": 1.5},
        "note": "text is kept in JSON only",
    }


def test_nested_metrics_flatten_to_slash_tags_and_skip_non_numbers():
    tags = dict(flatten_scalars(_record(2)))
    assert tags == {
        "reward_mean": 0.2,
        "kl": 1.0,
        "entropy": 1.25,
        "time/rollout": 2.0,
        "time/update": 1.5,
    }
    assert dict(flatten_scalars({"nan": float("nan"), "flag": True})) == {}


def test_tensorboard_receives_every_scalar_at_its_iteration(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for iteration in (1, 2, 3):
            logger.log(iteration, _record(iteration))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "time/rollout" in events.Tags()["scalars"]
    kl = [(e.step, e.value) for e in events.Scalars("kl")]
    assert kl == [(1, 0.5), (2, 1.0), (3, 1.5)]


def test_resume_keeps_iterations_before_the_checkpoint_only(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for iteration in range(1, 6):
            logger.log(iteration, {"reward_mean": iteration})
    with MetricsLogger(tmp_path, tensorboard=False, resume_at=4) as logger:
        logger.log(4, {"reward_mean": 40})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["iteration"], r["reward_mean"]) for r in records] == [
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 40),
    ]
