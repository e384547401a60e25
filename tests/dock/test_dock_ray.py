"""The dock on real Ray actors over the shared 3-node local cluster."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import numpy as np
import pytest
import ray
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.megatron.checkpoint import load_tree, save_tree
from mindrl.dock import (
    RL_FIELDS,
    DockClient,
    DockError,
    DockSlice,
    create_dock,
    restore_samples,
    shutdown_dock,
    snapshot_samples,
)
from mindrl.dock.controller import StageController, TDControllers
from mindrl.dock.handle import DockHandle, WarehouseInfo
from mindrl.dock.warehouse import TDWarehouse

pytestmark = pytest.mark.ray

G, N = 4, 3  # prompts, responses per prompt
GRPO_STAGES = {  # stage -> the fields it reads
    "rollout": ["prompt_ids"],
    "reward": ["prompt_ids", "response_ids"],
    "ref_logp": ["prompt_ids", "response_ids"],
    "old_logp": ["prompt_ids", "response_ids"],
    "advantage": ["reward"],
    "update": ["prompt_ids", "response_ids", "ref_logprob", "old_logprob", "advantages"],
}


def prompt(i: int) -> torch.Tensor:
    return torch.arange(i, i + 2 + i % 3, dtype=torch.int64)


def response(i: int) -> torch.Tensor:
    return torch.full((1 + i % 4,), i, dtype=torch.int64)


def logprob(i: int, shift: float) -> torch.Tensor:
    return torch.linspace(-1.0, 0.0, 1 + i % 4) * (i + shift)


def bytes_in(handle) -> list[int]:
    """Bytes each warehouse has taken in so far (the counters span iterations)."""
    return [e["bytes_in"] for e in DockClient(handle).stats()["endpoints"]]


@pytest.fixture(scope="module")
def dock(ray_cluster):
    handle = create_dock(RL_FIELDS, GRPO_STAGES, n_samples=G * N, group_size=N, timeout_s=20)
    yield handle
    shutdown_dock(handle)


def run_grpo_iteration(client: DockClient) -> None:
    """Every stage of one GRPO iteration, checking what each stage reads."""
    client.put(np.arange(G * N), {"prompt_ids": [prompt(i) for i in range(G * N)]})
    idx, batch = client.get("rollout", ["prompt_ids"], G * N, whole_groups=True)
    assert batch["prompt_ids"][0, : 2 + int(idx[0]) % 3].tolist() == prompt(int(idx[0])).tolist()
    client.put(idx, {"response_ids": [response(int(i)) for i in idx]})
    idx, batch = client.get("reward", ["prompt_ids", "response_ids"], G * N)
    client.put(idx, {"reward": batch["response_ids_lengths"].float()})
    for stage, field, shift in (("ref_logp", "ref_logprob", 0.5), ("old_logp", "old_logprob", 1)):
        idx, _ = client.get(stage, ["prompt_ids", "response_ids"], G * N)
        client.put(idx, {field: [logprob(int(i), shift) for i in idx]})
    idx, batch = client.get("advantage", ["reward"], G * N, whole_groups=True)
    rewards = batch["reward"].view(G, N)  # whole groups, in index order
    advantages = (rewards - rewards.mean(1, keepdim=True)).flatten()
    client.put(
        idx, {"advantages": [advantages[k].repeat(1 + int(i) % 4) for k, i in enumerate(idx)]}
    )
    fields = GRPO_STAGES["update"]
    parts = client.claim("update", fields, G * N, dp_parts=2)
    assert sorted(np.concatenate(parts).tolist()) == list(range(G * N))
    for part in parts:
        batch = client.fetch(part, fields)
        for row, i in enumerate(part.tolist()):
            n = 1 + i % 4
            assert batch["response_ids_lengths"][row] == n
            assert batch["response_ids"][row, :n].tolist() == response(i).tolist()
            assert batch["prompt_ids"][row, : 2 + i % 3].tolist() == prompt(i).tolist()
            assert torch.equal(batch["old_logprob"][row, :n], logprob(i, 1))
            assert torch.equal(batch["ref_logprob"][row, :n], logprob(i, 0.5))
            reward_mean = np.mean([1 + j % 4 for j in range(i - i % N, i - i % N + N)])
            assert batch["advantages"][row, 0].item() == pytest.approx(n - reward_mean)


def test_a_grpo_iteration_flows_through_every_stage_twice(dock):
    client = DockClient(dock)
    client.clear()
    run_grpo_iteration(client)
    client.clear()
    run_grpo_iteration(client)  # nothing of the first iteration is left to confuse it
    with pytest.raises(DockError, match=r"stage 'update' waited 1 s for 1 samples .* 1 missing"):
        client.claim("update", ["advantages"], 1, timeout_s=1)
    stats = client.stats()
    payload = sum(e["bytes_in"] + e["bytes_out"] for e in stats["endpoints"])
    assert 0 < stats["metadata_bytes"] < payload


def test_the_centralized_buffer_serves_the_same_iteration(ray_cluster):
    handle = create_dock(RL_FIELDS, GRPO_STAGES, G * N, group_size=N, kind="central", timeout_s=20)
    try:
        client = DockClient(handle)
        run_grpo_iteration(client)
        assert len(client.stats()["endpoints"]) == 1
    finally:
        shutdown_dock(handle)


def stream_chunks(client: DockClient, pieces: list[list[int]]) -> list[list[list[int]]]:
    """Put responses piece by piece while chunked ``reward`` claims (step 2, two DP parts)
    take them, a new claim opened as soon as one is answered; every chunk's parts."""
    client.put(np.arange(G * N), {"prompt_ids": [prompt(i) for i in range(G * N)]})
    chunks: list[list[list[int]]] = []

    def left() -> int:
        return G * N - sum(len(part) for chunk in chunks for part in chunk)

    def ask():
        return client.claim_async("reward", ["response_ids"], left(), dp_parts=2, step=2)

    pending = ask()
    for piece in [*pieces, None]:  # None: everything is put, wait for the rest
        if piece is not None:
            client.put(piece, {"response_ids": [response(i) for i in piece]})
        while left() and (piece is None or ray.wait([pending.ref], timeout=0.05)[0]):
            chunks.append([part.tolist() for part in pending.result()])
            if left():
                pending = ask()
    return chunks


@pytest.mark.parametrize("kind", ["distributed", "central"])
def test_chunked_claims_on_ray_hand_each_sample_once_as_it_is_put(ray_cluster, kind):
    handle = create_dock(RL_FIELDS, GRPO_STAGES, G * N, group_size=N, kind=kind, timeout_s=20)
    try:
        pieces = [[0, 1, 2], [3], [4, 5, 6, 7, 8], [9, 10], [11]]
        chunks = stream_chunks(DockClient(handle), pieces)
    finally:
        shutdown_dock(handle)
    taken = [i for chunk in chunks for part in chunk for i in part]
    assert sorted(taken) == list(range(G * N))  # every sample, none twice
    assert len(chunks) > 1
    assert all(len(left) == len(right) > 0 for left, right in chunks)


@pytest.mark.parametrize("kind", ["distributed", "central"])
def test_held_samples_wait_out_every_stage_until_given_back(ray_cluster, kind):
    handle = create_dock(RL_FIELDS, GRPO_STAGES, G * N, group_size=N, kind=kind, timeout_s=20)
    try:
        client = DockClient(handle)
        everything = np.arange(G * N)
        client.put(everything, {"prompt_ids": [prompt(i) for i in everything]})
        client.put(everything, {"response_ids": [response(i) for i in everything]})
        held = np.arange(N)  # group 0 waits; groups 1..G-1 are claimed now
        client.hold(held)
        for stage in ("reward", "ref_logp"):
            (taken,) = client.claim(stage, GRPO_STAGES[stage], (G - 1) * N, whole_groups=True)
            assert sorted(taken.tolist()) == list(range(N, G * N))
        client.hold(held, held=False)
        (taken,) = client.claim("reward", GRPO_STAGES["reward"], N, whole_groups=True)
        assert sorted(taken.tolist()) == held.tolist()
    finally:
        shutdown_dock(handle)


def test_samples_kept_by_a_checkpoint_come_back_at_their_indexes_with_their_versions(
    dock, tmp_path
):
    client = DockClient(dock)
    client.clear()
    everything, paused, finished = np.arange(G * N), np.arange(N), np.arange(N, G * N)
    client.put(everything, {"prompt_ids": [prompt(i) for i in everything]})
    client.put(paused, {"paused_ids": [response(i) for i in paused]})
    for version, rows in ((2, finished[:N]), (3, finished[N:])):  # two weights versions
        data = {"response_ids": [response(i) for i in rows]}
        client.put(rows, data | {"rollout_logprob": [logprob(i, 0) for i in rows]}, version)
    slices = [
        DockSlice(everything, ("prompt_ids",)),
        DockSlice(paused, ("paused_ids",)),
        DockSlice(finished, ("response_ids", "rollout_logprob"), "update"),
        DockSlice(np.zeros(0, dtype=np.int64), ("prompt_ids",)),  # nothing: skipped
    ]
    before = [client.fetch(part.indexes, list(part.fields)).clone() for part in slices[:3]]
    save_tree(tmp_path / "in_flight", snapshot_samples(client, slices))  # as a checkpoint
    client.clear()
    assert restore_samples(client, load_tree(tmp_path / "in_flight")) == 2 * G * N
    for part, was in zip(slices[:3], before, strict=True):
        now = client.fetch(part.indexes, list(part.fields))
        assert all(torch.equal(now[key], value) for key, value in was.items())
    assert client.versions("update", finished).tolist() == [2] * N + [3] * (G - 2) * N
    # Ready as before: the finished groups whole for a scoring stage, the paused one not.
    (taken,) = client.claim("reward", GRPO_STAGES["reward"], (G - 1) * N, whole_groups=True)
    assert sorted(taken.tolist()) == finished.tolist()
    assert client.ready_count("reward", ["response_ids"]) == len(finished)
    client.clear()


def test_samples_saved_past_this_docks_size_are_refused_in_one_line(dock):
    client = DockClient(dock)
    saved = [{"indexes": np.array([3, G * N + 5]), "versions": np.array([-1, -1]), "fields": {}}]
    with pytest.raises(DockError, match=rf"indexes up to {G * N + 5}, but this run's dock holds"):
        restore_samples(client, saved)


def test_one_warehouse_per_node_and_puts_land_in_the_local_one(dock):

    DockClient(dock).clear()
    assert len({w.node_id for w in dock.warehouses}) == 3
    before = bytes_in(dock)

    @ray.remote(num_cpus=0)
    def worker_put(handle):
        client = DockClient(handle)
        share = handle.warehouses[client.local_warehouse]
        idx = np.arange(share.first, share.last)
        client.put(idx, {"response_ids": [torch.arange(5) * 7 + int(i) for i in idx]})
        return client.local_warehouse, idx

    local, idx = ray.get(worker_put.options(resources={"mindrl_node_2": 0.01}).remote(dock))
    node2 = next(n["NodeID"] for n in ray.nodes() if n["Resources"].get("mindrl_node_2"))
    assert dock.warehouses[local].node_id == node2
    grew = [after > b for after, b in zip(bytes_in(dock), before, strict=True)]
    assert grew == [w == local for w in range(3)]

    @ray.remote(num_cpus=0)
    def worker_get(handle):
        got, batch = DockClient(handle).get("reward", ["response_ids"], len(idx), timeout_s=10)
        return got, batch["response_ids"].numpy().tobytes()

    got, remote_bytes = ray.get(worker_get.options(resources={"mindrl_node_1": 0.01}).remote(dock))
    expected = torch.stack([torch.arange(5) * 7 + int(i) for i in got]).numpy().tobytes()
    assert sorted(got.tolist()) == idx.tolist() and remote_bytes == expected


def test_a_bad_put_is_refused_before_any_warehouse_stores_anything(dock):

    client = DockClient(dock)
    client.clear()
    before = bytes_in(dock)
    everything = np.arange(G * N)  # spans all three warehouses
    with pytest.raises(DockError, match="unknown field 'logits'"):
        client.put(everything, {"logits": torch.zeros(G * N)})
    with pytest.raises(DockError, match="field 'reward' must be float32, got float64"):
        client.put(
            everything,
            {
                "prompt_ids": [prompt(i) for i in everything],
                "reward": torch.zeros(G * N, dtype=torch.float64),
            },
        )
    with pytest.raises(DockError, match=r"field 'reward' needs per-sample shape \(\)"):
        client.put(everything, {"reward": torch.zeros(G * N, 2)})
    with pytest.raises(DockError, match="field 'reward' has 3 samples for 12 indexes"):
        client.put(everything, {"reward": torch.zeros(3)})
    assert bytes_in(dock) == before
    with pytest.raises(DockError, match="stage 'rollout' waited 1 s"):
        client.claim("rollout", ["prompt_ids"], 1, timeout_s=1)


@pytest.mark.parametrize("kind", ["distributed", "central"])
def test_a_groups_prompt_sent_once_is_stored_for_each_of_its_responses(dock, kind):
    handle = dock if kind == "distributed" else create_dock(
        RL_FIELDS, GRPO_STAGES, n_samples=G * N, group_size=N, timeout_s=20, kind="central"
    )  # fmt: skip
    client = DockClient(handle)
    client.clear()
    before = sum(bytes_in(handle))
    prompts = [prompt(g) for g in range(G)]
    client.put(np.arange(G * N), {"prompt_ids": prompts}, repeat=N)
    # Each group's prompt and one length entry crossed once, not N times.
    assert sum(bytes_in(handle)) - before == sum(8 * len(p) + 8 for p in prompts)
    idx, batch = client.get("rollout", ["prompt_ids"], G * N, whole_groups=True)
    assert sorted(idx.tolist()) == list(range(G * N))  # every index announced
    for row, i in enumerate(idx.tolist()):
        n = len(prompts[i // N])
        assert batch["prompt_ids_lengths"][row] == n
        assert batch["prompt_ids"][row, :n].tolist() == prompts[i // N].tolist()
    with pytest.raises(
        DockError, match=f"field 'prompt_ids' has 2 samples for 12 indexes \\(one per {N}\\)"
    ):
        client.put(np.arange(G * N), {"prompt_ids": prompts[:2]}, repeat=N)
    if kind == "distributed":  # warehouses hold [0, 3), [3, 9), [9, 12): 1-3 spans two
        with pytest.raises(DockError, match="needs each row's indexes in one warehouse"):
            client.put(np.arange(1, 1 + 2 * N), {"prompt_ids": prompts[:2]}, repeat=N)
    client.clear()
    if kind == "central":
        shutdown_dock(handle)


def test_clear_right_after_a_put_leaves_no_stale_metadata(dock):
    client = DockClient(dock)
    client.put(np.arange(G * N), {"prompt_ids": [prompt(i) for i in range(G * N)]})
    client.clear()  # the put's announcements are still travelling: clear must drain them
    with pytest.raises(DockError, match=r"stage 'rollout' waited 1 s for 1 samples .*0 ready"):
        client.claim("rollout", ["prompt_ids"], 1, timeout_s=1)
    empty = client.fetch(np.array([], dtype=np.int64), ["prompt_ids", "reward"])
    assert empty.batch_size == (0,) and empty["prompt_ids"].shape == (0, 0)


@ray.remote(num_cpus=0)
class LateListeningController(TDControllers.__ray_actor_class__):
    """Real TD controllers that hear of each put half a second late, as over a slow
    link between nodes: calls from the driver overtake the warehouse's announcements."""

    async def on_put(self, *args, **kwargs) -> None:
        await asyncio.sleep(0.5)
        await super().on_put(*args, **kwargs)


def test_recycle_right_after_a_put_is_not_undone_by_the_puts_late_announcement(ray_cluster):
    fields = ["response_ids"]
    controller = StageController(LateListeningController.remote({"reward": fields}, N, N), "reward")
    node = ray.get_runtime_context().get_node_id()
    warehouse = TDWarehouse.remote(0, 0, N, RL_FIELDS, {"reward": (controller, fields)})
    client = DockClient(DockHandle(RL_FIELDS, N, N, [WarehouseInfo(warehouse, node, 0, N)],
                                   {"reward": controller}, timeout_s=10))  # fmt: skip
    client.put(np.arange(N), {"response_ids": [response(i) for i in range(N)]})
    client.recycle(np.arange(N))  # the put's announcements are still travelling
    time.sleep(1.0)  # long enough for any that was still travelling to land
    assert client.ready_count("reward", fields) == 0
    client.put(np.arange(1), {"response_ids": [response(7)]})
    assert client.ready_count("reward", fields) == 1  # its own late announcement waited for
    assert client.claim("reward", fields, 1, timeout_s=5)[0].tolist() == [0]
    for actor in (warehouse, controller.actor):
        ray.kill(actor, no_restart=True)


@pytest.fixture
def small_dock(ray_cluster):
    handle = create_dock(
        RL_FIELDS, {"reward": ["response_ids"]}, 6, group_size=3, warehouses=2, timeout_s=10
    )
    yield handle
    shutdown_dock(handle)


def kill_and_wait_for_death(actor, timeout_s: float = 10.0) -> None:
    """``ray.kill`` is asynchronous: a call sent right after it may still be served
    (it was, once in a CI run). Wait until the actor answers with its death."""
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=1)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the actor was still alive {timeout_s} s after ray.kill")


def test_a_killed_warehouse_fails_clearly_within_the_timeout(small_dock):

    client = DockClient(small_dock)
    client.put(np.arange(6), {"response_ids": [response(i) for i in range(6)]})
    # Announcements travel in the background; killed before they arrive, the controller
    # would never hear of samples 3-5 (the next test covers that case).
    ray.get([w.actor.flush.remote() for w in small_dock.warehouses])
    kill_and_wait_for_death(small_dock.warehouses[1].actor)
    start = time.monotonic()
    with pytest.raises(DockError, match=r"TD warehouse 1 \(node \w+\) is dead"):
        client.put(np.arange(3, 6), {"reward": torch.zeros(3)})
    with pytest.raises(DockError, match=r"TD warehouse 1 \(node \w+\) is dead"):
        client.get("reward", ["response_ids"], 6)
    assert time.monotonic() - start < 10


def test_a_stage_starved_by_a_dead_warehouse_names_the_warehouse(small_dock):

    client = DockClient(small_dock)
    client.put(np.arange(3), {"response_ids": [response(i) for i in range(3)]})
    kill_and_wait_for_death(small_dock.warehouses[1].actor)
    with pytest.raises(
        DockError,
        match=r"TD warehouse 1 \(node \w+\) is dead, so its samples never arrive; "
        r"stage 'reward' waited 1 s for 6 samples .*3 missing",
    ):
        client.get("reward", ["response_ids"], 6, timeout_s=1)


def test_a_killed_controller_fails_clearly_instead_of_hanging(small_dock):

    client = DockClient(small_dock)
    kill_and_wait_for_death(small_dock.controllers["reward"].actor)
    start = time.monotonic()
    with pytest.raises(DockError, match="TD controller of stage 'reward' is dead"):
        client.claim("reward", ["response_ids"], 1, timeout_s=5)
    # A put is announced in the background; the failed announcement surfaces by clear.
    client.put(np.arange(3), {"response_ids": [response(i) for i in range(3)]})
    with pytest.raises(DockError, match="TD controller of stage 'reward' is dead"):
        client.clear()
    assert time.monotonic() - start < 10


def test_the_controllers_of_a_nodes_stages_share_its_one_process(ray_cluster):
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])[:2]
    placed = {"rollout": nodes[0], "reward": nodes[0], "update": nodes[1]}
    stages = {stage: GRPO_STAGES[stage] for stage in placed}
    handle = create_dock(RL_FIELDS, stages, G * N, N, controller_nodes=placed, timeout_s=20)
    try:
        processes = handle.controller_actors()
        homes = {ray.get(actor.node_id.remote()): sorted(s) for actor, s in processes.items()}
        assert homes == {nodes[0]: ["reward", "rollout"], nodes[1]: ["update"]}
        client = DockClient(handle)  # each stage still claims only its own samples
        client.put(np.arange(N), {"prompt_ids": [prompt(i) for i in range(N)]})
        assert client.claim("rollout", ["prompt_ids"], N, timeout_s=5)[0].tolist() == list(range(N))
        with pytest.raises(DockError, match="stage 'reward' waited 1 s"):
            client.claim("reward", ["prompt_ids", "response_ids"], 1, timeout_s=1)
    finally:
        shutdown_dock(handle)


def tickets(draw_sizes: list[int], total: int) -> queue.Queue:
    """Claim sizes (whole groups) adding up to ``total``, for consumers to take turns on."""
    out: queue.Queue = queue.Queue()
    left = total
    for groups in draw_sizes:
        size = min(groups * N, left)
        if size:
            out.put(size)
        left -= size
    while left:
        out.put(N)
        left -= N
    return out


def consume(client: DockClient, stage: str, fields: list[str], work: queue.Queue, log: list):
    """Take claim tickets until none are left; record what each claim returned (or the
    error, so the test thread sees it)."""
    try:
        take_tickets(client, stage, fields, work, log)
    except Exception as exc:
        log.append(exc)


def take_tickets(client: DockClient, stage: str, fields: list[str], work: queue.Queue, log: list):
    while True:
        try:
            size = work.get_nowait()
        except queue.Empty:
            return
        idx, batch = client.get(stage, fields, size, whole_groups=True, timeout_s=15)
        log.append((idx, batch))
        if stage == "reward":  # the next stage waits on this
            client.put(idx, {"reward": idx.astype(np.float32) / 2})


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    order=st.permutations(range(G * N)),
    chunks=st.lists(st.integers(1, 4), min_size=G * N, max_size=G * N),
    sizes=st.lists(st.integers(1, 2), max_size=G),
    consumers=st.integers(2, 3),
)
def test_concurrent_consumers_take_every_index_once_with_identical_payloads(
    dock, order, chunks, sizes, consumers
):
    client = DockClient(dock)
    client.clear()  # each example is a new iteration: nothing may be lost to the previous
    payload = {i: torch.arange(i, i + 1 + (i * 7) % 5, dtype=torch.int64) * 3 for i in order}
    logs = {"reward": [], "advantage": []}
    jobs = [
        threading.Thread(target=consume, args=(DockClient(dock), stage, fields, work, logs[stage]))
        for stage, fields in (("reward", ["response_ids"]), ("advantage", ["reward"]))
        for work in [tickets(sizes, G * N)]
        for _ in range(consumers)
    ]
    for job in jobs:
        job.start()
    position = 0
    for chunk in chunks:  # the producer puts in a random order and random chunk sizes
        batch = order[position : position + chunk]
        if batch:
            client.put(np.array(batch), {"response_ids": [payload[i] for i in batch]})
        position += chunk
    for job in jobs:
        job.join(timeout=60)
    for stage, log in logs.items():
        failures = [entry for entry in log if isinstance(entry, Exception)]
        assert not failures, f"stage {stage}: {failures[0]}"
        taken = sorted(int(i) for idx, _ in log for i in idx)
        assert taken == list(range(G * N)), f"stage {stage} consumed {taken}"
    for idx, batch in logs["reward"]:
        for row, i in enumerate(idx.tolist()):
            n = len(payload[i])
            assert batch["response_ids"][row, :n].numpy().tobytes() == payload[i].numpy().tobytes()
    for idx, batch in logs["advantage"]:
        assert batch["reward"].tolist() == (idx / 2).tolist()
