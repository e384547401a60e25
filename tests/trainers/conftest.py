"""Runs more than one test module compares against, made once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.metrics import read_metrics
from tests.trainers.test_pipeline import ONE_DEVICE, trained_records

#: A reference model makes ref_logp a scoring stage (one that can stream, or claim whole
#: groups under partial rollout) besides reward.
WITH_REFERENCE = ("iterations=2", "algorithm.kl_coef=0.05")
#: PPO with every role (reference, critic), two epochs of two mini-batches: the policy
#: moves within the iteration.
PPO_WITH_REFERENCE = (
    "iterations=3",
    "algorithm.kl_coef=0.01",
    "actor.ppo_epochs=2",
    "actor.mini_batch_size=8",
)


@pytest.fixture(scope="session")
def sync_run(ray_cluster, tmp_path_factory) -> Path:
    """The folder of today's run of tiny with a reference model (metrics, memory check)."""
    folder = tmp_path_factory.mktemp("sync")
    trained_records(folder, "grpo", *WITH_REFERENCE)
    return folder / "run"


@pytest.fixture(scope="session")
def sync_records(sync_run) -> list[dict]:
    """That run's records: what a streaming run and a partial rollout whose budget no
    response reaches must both reproduce."""
    return read_metrics(sync_run / "metrics.jsonl")


@pytest.fixture(scope="session")
def one_device_records(ray_cluster, tmp_path_factory) -> list[dict]:
    """Tiny with a reference on one device: what a run stopped and resumed on one device
    (a restart, a preemption) must end with."""
    return trained_records(tmp_path_factory.mktemp("one"), "grpo", *WITH_REFERENCE, *ONE_DEVICE)


@pytest.fixture(scope="session")
def ppo_records(ray_cluster, tmp_path_factory) -> list[dict]:
    """Today's PPO run with every role resident, on one device (three roles there are three
    processes a device): its stages, and what an offloaded run must reproduce."""
    folder = tmp_path_factory.mktemp("ppo")
    return trained_records(folder, "ppo", *PPO_WITH_REFERENCE, *ONE_DEVICE)
