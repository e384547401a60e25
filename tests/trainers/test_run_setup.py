"""Start-up arithmetic of trainers/driver/setup.py that needs no Ray."""

from __future__ import annotations

import pytest

from mindrl.config import load_config
from mindrl.run_plan import build_run_plan
from trainers.driver.cli import DEFAULT_CONFIG
from trainers.driver.setup import _updates_per_iteration
from trainers.registry import get_algorithm


def test_each_role_schedules_its_learning_rate_over_its_own_optimizer_steps():
    config = load_config(
        DEFAULT_CONFIG,
        ["actor.mini_batch_size=8", "critic.mini_batch_size=4", "critic.ppo_epochs=2"],
        algorithm=get_algorithm("ppo"),
    )
    # 16 prompts per iteration: the actor steps 16 / 8 = 2 times, the critic 2 x 16 / 4 = 8.
    assert _updates_per_iteration(config, "actor") == 2
    assert _updates_per_iteration(config, "critic") == 8


def test_a_local_ray_that_fails_to_start_ends_start_up_in_one_line(monkeypatch):
    import ray

    from trainers.driver import setup

    def node_timed_out(**kwargs):
        raise Exception("The current node timed out during startup. This could happen ...")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", node_timed_out)
    config = load_config(DEFAULT_CONFIG, [], algorithm=get_algorithm("grpo"))
    with pytest.raises(setup.RunSetupError) as err:
        setup._connect_ray(config, "cpu", build_run_plan(get_algorithm("grpo"), config))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("could not start a local Ray instance (The current node timed out")
    assert "ray start --head" in message


def _complete_step(role_dir, step):
    """A step folder as the checkpoint writer publishes it (weights + manifest)."""
    import json

    import torch

    from backends.megatron import checkpoint

    step_dir = role_dir / f"step_{step:08d}"
    checkpoint.save_tree(step_dir / "model", {"w": torch.arange(4.0)})
    files = {p.name: p.stat().st_size for p in step_dir.iterdir()}
    (step_dir / "meta.json").write_text(json.dumps({"format": checkpoint.FORMAT, "files": files}))
    (role_dir / "latest").write_text(step_dir.name + "\n")
    return step_dir


def test_resume_checks_the_checkpoint_before_any_process_starts(tmp_path):
    from trainers.driver.setup import RunSetupError, prepare_run

    config = load_config(
        DEFAULT_CONFIG, [f"logging.dir={tmp_path}"], algorithm=get_algorithm("grpo")
    )
    actor = tmp_path / "checkpoints" / "actor"
    older, latest = _complete_step(actor, 4), _complete_step(actor, 8)
    run = prepare_run(config, "grpo", True)
    assert run.resume_steps == {"actor": latest}
    run = prepare_run(config, "grpo", str(older))  # --resume-from a step folder
    assert run.resume_steps == {"actor": older}
    (latest / "model.safetensors").write_bytes(b"\x00" * 10)  # a truncated copy
    with pytest.raises(RunSetupError) as err:
        prepare_run(config, "grpo", True)
    assert str(err.value) == (
        f"--resume: checkpoint {latest} is corrupt: {latest / 'model.safetensors'} has 10 bytes, "
        f"{(older / 'model.safetensors').stat().st_size} were written; the previous complete "
        f"step is {older}: resume from it with --resume-from {older}"
    )


def test_each_data_parallel_part_is_claimed_beside_its_first_ranks_warehouse():
    from types import SimpleNamespace

    from mindrl.dock import RL_FIELDS, DockClient
    from mindrl.dock.handle import DockHandle, WarehouseInfo
    from trainers.driver.setup import _model_placement
    from trainers.driver.state import RunState

    shares = [(0, 8), (8, 16), (16, 24)]
    handle = DockHandle(RL_FIELDS, 24, 4, [WarehouseInfo(None, f"node{i}", a, b)
                                           for i, (a, b) in enumerate(shares)])  # fmt: skip
    config = SimpleNamespace(dock=SimpleNamespace(local_claims=True))
    run = RunState(config, *[None] * 8)  # the rest of the driver state plays no part here
    run.dock = DockClient(handle)
    # TP 2 x DP 2 over nodes 2, 2, 0, 0: part 0 is ranks 0-1 (node 2), part 1 ranks 2-3.
    run.rank_nodes["actor"] = ["node2", "node2", "node0", "node0"]
    run.dp_ranks["actor"] = [0, 0, 1, 1]
    assert run.part_warehouses("actor") == [2, 0]
    # Generation TP 1: each rank its own part; a node without a warehouse has none.
    assert run.part_warehouses("actor", [0, 1, 2, 3]) == [2, 2, 0, 0]
    run.rank_nodes["reward"] = ["node9"]
    assert run.part_warehouses("reward", range(1)) == [None]
    assert run.part_warehouses("critic") is None  # no such role in this run
    config.dock.local_claims = False  # split by length alone, as on one node
    assert run.part_warehouses("actor") is None

    resources = SimpleNamespace(nodes=4, devices_per_node=1)
    assert _model_placement(SimpleNamespace(resources=resources)) == "SPREAD"
    resources.devices_per_node = 8  # a node's own devices keep a TP group together
    assert _model_placement(SimpleNamespace(resources=resources)) == "PACK"


def test_generation_claims_prompts_beside_the_rollout_workers_where_they_generate():
    from types import SimpleNamespace

    from mindrl.dock import RL_FIELDS, DockClient
    from mindrl.dock.handle import DockHandle, WarehouseInfo
    from trainers.driver.state import RunState

    shares = [(0, 8), (8, 16), (16, 24)]
    handle = DockHandle(RL_FIELDS, 24, 4, [WarehouseInfo(None, f"node{i}", a, b)
                                           for i, (a, b) in enumerate(shares)])  # fmt: skip
    config = SimpleNamespace(dock=SimpleNamespace(local_claims=True))
    run = RunState(config, *[None] * 8)
    run.dock = DockClient(handle)
    run.rank_nodes["actor"] = ["node0", "node0"]
    run.dp_ranks["actor"] = [0, 1]
    run.gen_dp_ranks = [0, 1]
    # Collocated: the actor's ranks generate, beside warehouse 0.
    assert run.generation_warehouses() == [0, 0]
    # Disaggregated: two rollout workers on nodes 1 and 2 generate, each beside its own.
    run.groups["rollout"] = SimpleNamespace(size=2)
    run.rank_nodes["rollout"] = ["node1", "node2"]
    assert run.generation_warehouses() == [1, 2]


def test_group_local_advantages_run_beside_each_warehouse_and_the_rest_on_reward_rank_0():
    from types import SimpleNamespace

    import numpy as np

    from mindrl.dock import RL_FIELDS, DockClient
    from mindrl.dock.handle import DockHandle, WarehouseInfo
    from trainers.driver.state import RunState
    from trainers.driver.streaming import advantage_parts

    shares = [(0, 8), (8, 16), (16, 24)]  # groups of 4: two per warehouse
    handle = DockHandle(RL_FIELDS, 24, 4, [WarehouseInfo(None, f"node{i}", a, b)
                                           for i, (a, b) in enumerate(shares)])  # fmt: skip
    config = SimpleNamespace(dock=SimpleNamespace(local_claims=True))
    run = RunState(config, *[None] * 8)
    run.dock = DockClient(handle)
    run.groups["reward"] = SimpleNamespace(size=3)
    # Reward workers on nodes 1, 1, 2: nothing beside warehouse 0.
    run.rank_nodes["reward"] = ["node1", "node1", "node2"]
    claimed = np.array([0, 1, 2, 3, 8, 9, 10, 11, 20, 21, 22, 23])
    run.plan = SimpleNamespace(group_local_advantages=True)
    parts = advantage_parts(run, claimed)
    # Warehouse 1's groups to rank 0 (the first worker on node 1) with warehouse 0's,
    # which has no worker beside it; warehouse 2's to rank 2; rank 1 gets nothing.
    assert {r: p.tolist() for r, p in parts.items()} == {
        0: [0, 1, 2, 3, 8, 9, 10, 11],
        2: [20, 21, 22, 23],
    }
    run.rank_nodes["reward"] = ["node2", "node1", "node0"]
    parts = advantage_parts(run, claimed)
    assert {r: p.tolist() for r, p in parts.items()} == {
        0: [20, 21, 22, 23], 1: [8, 9, 10, 11], 2: [0, 1, 2, 3]
    }  # fmt: skip
    # A batch-normalising estimator (PPO's whitened GAE) needs the batch on one worker,
    # and so does a run whose claims ignore the warehouses.
    run.plan.group_local_advantages = False
    assert list(advantage_parts(run, claimed)) == [0]
    run.plan.group_local_advantages, config.dock.local_claims = True, False
    assert list(advantage_parts(run, claimed)) == [0]


def test_a_chunks_groups_are_dealt_whole_over_every_reward_worker_beside_their_warehouse():
    import numpy as np

    from trainers.driver.streaming import groups_over_workers

    # Groups of 4; groups 0, 1, 5 in warehouse 0, groups 2, 3 in warehouse 1, 4 in 2.
    claimed = np.concatenate([np.arange(g * 4, g * 4 + 4) for g in (0, 2, 1, 3, 4, 5)])
    owners = np.array([{0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 0}[i // 4] for i in claimed])
    # Ranks 0 and 2 beside warehouse 0, rank 1 beside warehouse 1, none beside 2.
    dealt = groups_over_workers(claimed, 4, owners, [0, 1, 0])
    groups = {rank: sorted(set((part // 4).tolist())) for rank, part in dealt.items()}
    assert groups == {0: [0, 4, 5], 1: [2, 3], 2: [1]}  # group 4: no rank beside, so any
    assert all(len(part) % 4 == 0 for part in dealt.values())  # never a split group
    assert sorted(np.concatenate(list(dealt.values())).tolist()) == sorted(claimed.tolist())
    # Workers that say nothing of where they are share every warehouse's groups in turn.
    dealt = groups_over_workers(claimed, 4, owners, [None, None])
    assert {r: sorted(set((p // 4).tolist())) for r, p in dealt.items()} == {
        0: [0, 2, 4, 5], 1: [1, 3]
    }  # fmt: skip


def test_grpo_like_estimators_declare_group_local_advantages_and_batch_whitening_ones_do_not():
    local = {name for name in ("grpo", "dapo", "dr_grpo", "gspo", "rloo")
             if get_algorithm(name).group_local_advantages}  # fmt: skip
    assert local == {"grpo", "dapo", "dr_grpo", "gspo", "rloo"}
    for name in ("ppo", "pf_ppo", "reinforce_pp"):
        assert not get_algorithm(name).group_local_advantages, name
    config = load_config(DEFAULT_CONFIG)
    assert build_run_plan(get_algorithm("grpo"), config).group_local_advantages
    assert not build_run_plan(get_algorithm("ppo"), config).group_local_advantages
