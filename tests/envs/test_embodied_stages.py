"""A rank's environments split into pipeline stages step exactly what one whole
simulator steps, in place (collocated) and in an environment worker (hybrid, or in the
run's reserved group: disaggregated), and the worker steps one stage while the caller
goes on."""

from __future__ import annotations

import numpy as np
import pytest
import ray

from mindrl.envs.embodied import EnvConfigError
from mindrl.envs.stages import StageLayout, build_stages
from mindrl.workers.group import StageTimeoutError
from tests.envs.test_embodied_reach import assert_same_outputs, random_actions

PATH = "mindrl.envs.batched_reach:BatchedReach"
NUM_ENVS, FIRST, CHUNK, HORIZON = 8, 16, 4, 12
OPTIONS = {"chunk_size": CHUNK, "horizon": HORIZON, "auto_reset": True, "seed": 3}


def stages(count: int):
    return build_stages(PATH, StageLayout(NUM_ENVS, FIRST, count), **OPTIONS)


def episode(env, groups: np.ndarray, actions: np.ndarray) -> list[tuple]:
    """A reset into ``groups``, a chunk step per chunk of ``actions``, a partial reset of
    rows 1, 2 and 5 and one more step: every answer."""
    answers = [(env.reset(reset_state_ids=groups),)]
    answers += [env.chunk_step(chunk) for chunk in actions]
    answers.append((env.reset(env_ids=np.array([5, 1, 2])),))
    answers.append(env.chunk_step(actions[0]))
    return answers


def test_two_and_four_stages_step_the_trajectories_of_one_whole_simulator():
    groups = np.repeat(np.arange(4), 2) + 40
    actions = random_actions(NUM_ENVS, HORIZON // CHUNK + 1, CHUNK)
    whole = episode(stages(1), groups, actions)
    for count in (2, 4):
        for mine, theirs in zip(episode(stages(count), groups, actions), whole, strict=True):
            assert_same_outputs(mine, theirs)


def test_every_stage_holds_its_own_global_environment_numbers():
    split = stages(4)
    assert [env.first_env_id for env in split.envs] == [16, 18, 20, 22]
    assert [env.num_envs for env in split.envs] == [2, 2, 2, 2]
    np.testing.assert_array_equal(split.expert_actions(), stages(1).expert_actions())


def test_stages_that_do_not_divide_a_ranks_environments_are_refused_in_one_line():
    with pytest.raises(EnvConfigError, match=r"env\.pipeline_stages=3 does not divide a rank's 8"):
        StageLayout(NUM_ENVS, 0, 3)


def test_a_stage_is_timed_where_it_steps():
    split = stages(2)
    split.reset()
    split.chunk_step(random_actions(NUM_ENVS, 1, CHUNK)[0])
    seconds = split.take_env_seconds()
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    assert split.take_env_seconds() == [0.0, 0.0]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_an_environment_worker_steps_the_same_trajectories_while_the_caller_goes_on():
    from mindrl.workers.vector_env_worker import start_remote_stages

    groups = np.repeat(np.arange(4), 2)
    actions = random_actions(NUM_ENVS, HORIZON // CHUNK + 1, CHUNK, seed=5)
    remote = start_remote_stages(PATH, StageLayout(NUM_ENVS, FIRST, 2), **OPTIONS)
    try:
        for mine, theirs in zip(
            episode(remote, groups, actions), episode(stages(1), groups, actions), strict=True
        ):
            assert_same_outputs(mine, theirs)
        # Both stages' steps are submitted before either is waited on.
        calls = [remote.submit_step(s, actions[0][remote.layout.rows(s)]) for s in (0, 1)]
        assert all(len(call.result()[1]) == NUM_ENVS // 2 for call in calls)
        assert all(s > 0 for s in remote.take_env_seconds())
    finally:
        remote.close()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_an_environment_worker_refusing_its_keywords_says_so_in_one_line():
    from mindrl.workers.vector_env_worker import start_remote_stages

    layout = StageLayout(NUM_ENVS, 0, 2)
    with pytest.raises(EnvConfigError, match=r"refuses env\.kwargs"):
        start_remote_stages(PATH, layout, **OPTIONS, kwargs={"colour_count": 9})


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_a_disaggregated_environment_worker_steps_in_its_ranks_bundle_of_the_runs_group():
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from mindrl.workers.vector_env_worker import (
        EnvWorkerPlace,
        reserve_env_workers,
        start_remote_stages,
    )

    group = reserve_env_workers(2, timeout_s=60)
    groups = np.repeat(np.arange(4), 2)
    actions = random_actions(NUM_ENVS, HORIZON // CHUNK + 1, CHUNK, seed=6)
    layout, place = StageLayout(NUM_ENVS, FIRST, 2), EnvWorkerPlace(bundle=1)
    remote = start_remote_stages(PATH, layout, place=place, **OPTIONS)
    try:
        node, group_id = ray.get(remote.worker.where.remote())
        assert group_id == group.id.hex()
        # SPREAD over the session's three Ray nodes: the two bundles on two nodes, and
        # the worker on its bundle's.
        nodes = placement_group_table(group)["bundles_to_node_id"]
        assert len(set(nodes.values())) == 2 and node == nodes[1]
        for mine, theirs in zip(
            episode(remote, groups, actions), episode(stages(1), groups, actions), strict=True
        ):
            assert_same_outputs(mine, theirs)
    finally:
        remote.close()
        remove_placement_group(group)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_environment_workers_the_cluster_cannot_hold_are_refused_in_one_line():
    from mindrl.workers.vector_env_worker import reserve_env_workers

    with pytest.raises(StageTimeoutError, match="cannot place 4096 environment workers of "):
        reserve_env_workers(4096, timeout_s=1)


def test_a_simulator_that_steps_on_the_host_refuses_a_device_in_one_line():
    line = r"BatchedReach takes no device keyword \(it steps on the host\): set env.device=cpu"
    with pytest.raises(EnvConfigError, match=line):
        build_stages(PATH, StageLayout(NUM_ENVS, 0, 1), device="cuda:0", **OPTIONS)
