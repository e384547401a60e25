"""The reward worker on a real dock (the shared Ray cluster): the reward and a group-local
estimator's advantages computed in one call (continuous generation's chunks) put exactly
what the two stages put one after the other (mindrl/workers/reward.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mindrl.config import load_config
from mindrl.data import PromptRecord, load_tokenizer
from mindrl.data.records import record_fields
from mindrl.dock import DockClient, create_dock, shutdown_dock
from mindrl.dock.schema import RUN_FIELDS
from mindrl.run_plan import build_run_plan
from mindrl.workers.context import stage_context
from mindrl.workers.reward import RewardWorker
from trainers.registry import get_algorithm

pytestmark = pytest.mark.ray

N = 4  # responses per group
GROUPS = 3


def rl_stages(plan) -> dict[str, list[str]]:
    return {s.name: list(s.reads) or ["prompt_ids"] for s in plan.stages}


@pytest.fixture
def reward_worker_and_dock(ray_cluster):
    algorithm = get_algorithm("grpo")
    config = load_config(None, [f"data.n_samples_per_prompt={N}"], algorithm=algorithm)
    plan = build_run_plan(algorithm, config)
    handle = create_dock(RUN_FIELDS, rl_stages(plan), 2 * GROUPS * N, group_size=N, timeout_s=30)
    worker = RewardWorker(0, 1, stage_context(plan, "reward", config, algorithm))
    worker.attach(handle)
    yield worker, DockClient(handle)
    shutdown_dock(handle)


def put_responses_twice(dock: DockClient) -> tuple[np.ndarray, np.ndarray]:
    """The same groups at two sets of indexes: per group, responses all right, half right,
    wrong and too long (so rewards differ within each group), each prompt's record and
    group ids."""
    tokenizer = load_tokenizer("builtin:tiny")
    rows, records = [], []
    for g in range(GROUPS):
        answer = f"{g + 2} 1"
        for text in (answer, f"{g + 2} 3", "4", f"{answer} 1 1"):
            ids = tokenizer.encode(text, add_special_tokens=False)
            rows.append(torch.tensor(ids, dtype=torch.int64))
            records.append(PromptRecord(f"q#{g}", f"copy : {answer} =", answer))
    first = np.arange(GROUPS * N)
    second = first + GROUPS * N
    for indexes in (first, second):
        dock.put(indexes, {
            "response_ids": rows,
            **record_fields(records),
            "group_id": torch.tensor(indexes // N),
        })  # fmt: skip
    return first, second


def test_reward_and_advantages_in_one_call_put_what_the_two_stages_put(reward_worker_and_dock):
    worker, dock = reward_worker_and_dock
    apart, together = put_responses_twice(dock)
    worker.score(apart)
    worker.advantages(apart)
    report = worker.score_with_advantages(together)
    fields = ["reward", "advantages"]
    expected, fused = dock.fetch(apart, fields), dock.fetch(together, fields)
    assert fused["reward"].tolist() == expected["reward"].tolist()
    assert expected["reward"][:N].tolist() == [1.0, 0.5, 0.0, 0.5]  # a real spread
    assert torch.equal(fused["advantages"], expected["advantages"])
    assert expected["advantages"].abs().sum() > 0
    assert report["indexes"].tolist() == together.tolist()
    assert report["sample_rewards"].tolist() == expected["reward"].tolist()
