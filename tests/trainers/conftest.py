"""Runs more than one test module compares against, made once per test session."""

from __future__ import annotations

import pytest

from tests.trainers.test_pipeline import trained_records

#: A reference model makes ref_logp a scoring stage (one that can stream, or claim whole
#: groups under partial rollout) besides reward.
WITH_REFERENCE = ("iterations=2", "algorithm.kl_coef=0.05")


@pytest.fixture(scope="session")
def sync_records(ray_cluster, tmp_path_factory) -> list[dict]:
    """Today's run of tiny with a reference model: what a streaming run and a partial
    rollout whose budget no response reaches must both reproduce."""
    return trained_records(tmp_path_factory.mktemp("sync"), "grpo", *WITH_REFERENCE)
