"""The dock on real Ray actors over the shared 3-node local cluster."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from mindrl.dock import RL_FIELDS, DockClient, DockError, create_dock, shutdown_dock

pytestmark = pytest.mark.ray

G, N = 4, 3  # prompts, responses per prompt
STAGES = ["rollout", "reward", "advantage", "update"]


def prompts(n: int) -> list[torch.Tensor]:
    return [torch.arange(i, i + 2 + i % 3, dtype=torch.int64) for i in range(n)]


@pytest.fixture
def dock(ray_cluster):
    handle = create_dock(RL_FIELDS, STAGES, n_samples=G * N, group_size=N, timeout_s=20)
    yield handle
    shutdown_dock(handle)


@pytest.mark.parametrize("kind", ["distributed", "central"])
def test_a_grpo_iteration_flows_through_every_stage(ray_cluster, kind):
    handle = create_dock(RL_FIELDS, STAGES, n_samples=G * N, group_size=N, kind=kind, timeout_s=20)
    try:
        client = DockClient(handle)
        client.put(np.arange(G * N), {"prompt_ids": prompts(G * N)})
        idx, batch = client.get("rollout", ["prompt_ids"], G * N, whole_groups=True)
        responses = [torch.full((1 + int(i) % 4,), int(i), dtype=torch.int64) for i in idx]
        client.put(idx, {"response_ids": responses})
        idx, batch = client.get("reward", ["response_ids"], G * N)
        rewards = batch["response_ids_lengths"].float()
        client.put(idx, {"reward": rewards})
        idx, batch = client.get("advantage", ["reward"], G * N, whole_groups=True)
        adv = [torch.full((1 + int(i) % 4,), float(i)) for i in idx]
        client.put(idx, {"advantages": adv})
        parts = client.claim("update", ["response_ids", "advantages"], G * N, dp_parts=2)
        assert sorted(np.concatenate(parts).tolist()) == list(range(G * N))
        batch = client.fetch(parts[0], ["prompt_ids", "response_ids", "advantages"])
        for row, i in enumerate(parts[0].tolist()):
            n = 1 + i % 4
            assert batch["response_ids"][row, :n].tolist() == [i] * n
            assert batch["prompt_ids"][row, : 2 + i % 3].tolist() == prompts(G * N)[i].tolist()
        client.clear()
        with pytest.raises(DockError, match="stage 'update' waited 1 s for 1 samples"):
            client.claim("update", ["advantages"], 1, timeout_s=1)
    finally:
        shutdown_dock(handle)


def test_one_warehouse_per_node_and_puts_land_in_the_local_one(ray_cluster, dock):
    import ray

    nodes = {w.node_id for w in dock.warehouses}
    assert len(dock.warehouses) == 3 and len(nodes) == 3

    @ray.remote(num_cpus=0)
    def worker_put(handle, node_resource: str):
        client = DockClient(handle)
        local = client._local
        share = handle.warehouses[local]
        idx = np.arange(share.first, share.last)
        client.put(idx, {"prompt_ids": [torch.arange(5) + int(i) for i in idx]})
        return local, idx

    local, idx = ray.get(worker_put.options(resources={"mindrl_node_2": 0.01}).remote(dock, "x"))
    node2 = next(n["NodeID"] for n in ray.nodes() if n["Resources"].get("mindrl_node_2"))
    assert dock.warehouses[local].node_id == node2
    stats = ray.get([w.actor.stats.remote() for w in dock.warehouses])
    assert [s["bytes_in"] > 0 for s in stats].count(True) == 1 and stats[local]["bytes_in"] > 0

    @ray.remote(num_cpus=0)
    def worker_fetch(handle, idx):
        return DockClient(handle).fetch(idx, ["prompt_ids"])["prompt_ids"].numpy().tobytes()

    remote_bytes = ray.get(
        worker_fetch.options(resources={"mindrl_node_1": 0.01}).remote(dock, idx)
    )
    expected = torch.stack([torch.arange(5) + int(i) for i in idx]).numpy().tobytes()
    assert remote_bytes == expected


def test_a_killed_warehouse_fails_clearly_and_quickly(ray_cluster, dock):
    import ray

    client = DockClient(dock)
    ray.kill(dock.warehouses[1].actor, no_restart=True)
    start = time.monotonic()
    share = dock.warehouses[1]
    with pytest.raises(DockError, match=r"TD warehouse 1 \(node \w+\) is dead"):
        client.put(
            np.arange(share.first, share.last), {"reward": torch.zeros(share.last - share.first)}
        )
    assert time.monotonic() - start < 20


def test_a_killed_controller_fails_clearly_instead_of_hanging(ray_cluster, dock):
    import ray

    client = DockClient(dock)
    ray.kill(dock.controllers["reward"], no_restart=True)
    with pytest.raises(DockError, match="TD controller of stage 'reward' is dead"):
        client.claim("reward", ["response_ids"], 1, timeout_s=5)


def test_a_bad_put_through_the_client_is_refused_before_anything_is_stored(ray_cluster, dock):
    client = DockClient(dock)
    with pytest.raises(DockError, match="unknown field 'logits'"):
        client.put(np.arange(3), {"logits": torch.zeros(3)})
    with pytest.raises(DockError, match="must be float32, got float64"):
        client.put(
            np.arange(3), {"prompt_ids": prompts(3), "reward": torch.zeros(3, dtype=torch.float64)}
        )
    with pytest.raises(DockError, match="stage 'rollout' waited 1 s"):
        client.claim("rollout", ["prompt_ids"], 1, timeout_s=1)
