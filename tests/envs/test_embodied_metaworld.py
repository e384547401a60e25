"""MetaWorldVectorEnv: push-v3 in worker processes keeps the vector interface, its
scripted expert succeeds through it, group members start alike, the number of processes
changes nothing, and no worker outlives the environment."""

from __future__ import annotations

import gc

import numpy as np
import pytest

pytest.importorskip("metaworld", reason="needs Meta-World: pip install 'mindrl[metaworld]'")
import psutil

from mindrl.envs.demonstrations import record_expert
from mindrl.envs.embodied import EnvConfigError, VectorEnv
from mindrl.envs.metaworld_env import (
    MetaWorldVectorEnv,
    scripted_expert,
)

TASK, STATE_DIM, CHUNK = "push-v3", 39, 2
HORIZON = 120


@pytest.fixture(scope="module")
def env() -> MetaWorldVectorEnv:
    # One action per chunk: the expert acts on every observation (chunks of several
    # actions are the next test's).
    env = MetaWorldVectorEnv(
        num_envs=4, chunk_size=1, horizon=HORIZON, seed=3, task=TASK, num_processes=2
    )
    yield env  # shared: building one starts processes that import MuJoCo and Meta-World
    env.close()


def test_observations_and_chunk_results_have_the_interface_shapes(env):
    assert isinstance(env, VectorEnv)
    observations = env.reset()
    assert observations.images.shape == (4, 64, 64, 3)
    assert observations.images.dtype == np.uint8
    assert observations.states.shape == (4, STATE_DIM)
    assert observations.states.dtype == np.float32
    assert observations.instructions == ["push the puck to the goal"] * 4
    vocab = env.observation_spec.instruction_vocab
    words = [vocab[i] for i in observations.instruction_ids[0]]
    assert words == ["push", "the", "puck", "to", "the", "goal"]
    assert env.action_spec.dims == 4
    result = env.chunk_step(np.zeros((4, 1, 4)))
    _, rewards, terminations, truncations, info = result
    for flags in (rewards, terminations, truncations, info["valid"]):
        assert flags.shape == (4, 1)
    assert rewards.dtype == np.float32
    assert info["valid"].all()
    assert info["success"].shape == (4,)
    assert not terminations.any() and not truncations.any()
    with pytest.raises(ValueError, match=r"\[num_envs, chunk_size, dims\]"):
        env.chunk_step(np.zeros((4, 1, 3)))


def test_group_members_start_identical_and_move_identically_across_processes(env):
    # Members 0 and 2 (and 1 and 3) sit in different worker processes.
    observations = env.reset(reset_state_ids=np.array([5, 6, 5, 6]))
    states = observations.states
    np.testing.assert_array_equal(states[0], states[2])
    np.testing.assert_array_equal(states[1], states[3])
    assert not np.array_equal(states[0], states[1])  # another state id, another puck/goal
    actions = np.random.default_rng(0).uniform(-1, 1, size=(1, 1, 4)).repeat(4, axis=0)
    after, rewards, *_ = env.chunk_step(actions)
    np.testing.assert_array_equal(after.states[0], after.states[2])
    np.testing.assert_array_equal(rewards[0], rewards[2])


def test_the_scripted_expert_succeeds_on_most_episodes_through_the_vector_env(env):
    act = scripted_expert(TASK)
    observations = env.reset()
    success = np.zeros(env.num_envs, dtype=bool)
    ended = np.zeros(env.num_envs, dtype=bool)
    for _ in range(HORIZON):
        actions = act(observations.states)[:, None]
        observations, rewards, terminations, truncations, info = env.chunk_step(actions)
        success |= info["success"] & ~ended
        assert np.all(rewards <= 10.0)
        ended |= (terminations | truncations).any(axis=1)
        if ended.all():
            break
    assert ended.all()
    assert success.sum() >= 3, success


def test_the_success_reward_pays_one_for_the_succeeding_action_and_nothing_else():
    env = MetaWorldVectorEnv(
        num_envs=2,
        chunk_size=1,
        horizon=HORIZON,
        seed=3,
        task=TASK,
        num_processes=1,
        reward="success",
    )
    try:
        act, observations = scripted_expert(TASK), env.reset()
        returns, success = np.zeros(2), np.zeros(2, dtype=bool)
        for _ in range(HORIZON):
            observations, rewards, *_, info = env.chunk_step(act(observations.states)[:, None])
            returns += np.where(success, 0.0, rewards[:, 0])
            success |= info["success"]
            if success.all():
                break
    finally:
        env.close()
    assert success.all()  # the expert pushes both pucks home
    np.testing.assert_array_equal(returns, [1.0, 1.0])
    with pytest.raises(ValueError, match="reward must be one of"):
        MetaWorldVectorEnv(num_envs=1, reward="dense")


def test_two_processes_give_exactly_the_episodes_of_one():
    # A horizon of 4 actions makes the second chunk truncate every episode and reset it.
    kwargs = {"num_envs": 2, "chunk_size": CHUNK, "horizon": 4, "seed": 11, "task": TASK}
    envs = [MetaWorldVectorEnv(num_processes=k, **kwargs) for k in (1, 2)]
    try:
        firsts = [env.reset() for env in envs]
        np.testing.assert_array_equal(firsts[0].states, firsts[1].states)
        rng = np.random.default_rng(1)
        for chunk in range(3):
            actions = rng.uniform(-1.2, 1.2, size=(2, CHUNK, 4))
            one, two = (env.chunk_step(actions) for env in envs)
            assert one[1].shape == one[3].shape == (2, CHUNK)
            for a, b in zip(one[1:4], two[1:4], strict=True):
                np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(one[0].states, two[0].states)
            final_one, final_two = (r[4]["final_observations"].states for r in (one, two))
            np.testing.assert_array_equal(final_one, final_two)
            truncated = chunk == 1
            assert one[3][:, -1].all() == truncated
            # After a truncation the observations are the new episodes' first ones.
            assert np.array_equal(one[0].states, final_one) != truncated
    finally:
        pids = [pid for env in envs for pid in env.worker_pids]
        envs[0].close()
        del envs  # the second is stopped by garbage collection alone
        gc.collect()
    assert [pid for pid in pids if _alive(pid)] == []


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie left unreaped counts as left)."""
    return psutil.pid_exists(pid)


def test_the_expert_dataset_pairs_every_applied_action_with_its_state(env):
    data = record_expert(env, episodes=3)
    assert data["success"].shape == (3,) and data["success"].sum() >= 2
    lengths = np.bincount(data["episode"], minlength=3)
    assert np.all((lengths > 10) & (lengths <= HORIZON))
    assert data["states"].shape == (lengths.sum(), STATE_DIM)
    assert data["actions"].shape == (lengths.sum(), 1, 4)  # chunks of one
    assert np.abs(data["actions"]).max() <= 1.0
    # Each state holds the previous frame (floats 18..35 repeat the last state's 0..17):
    # an episode's pairs are its own, in the order they were taken.
    for episode in range(3):
        states = data["states"][data["episode"] == episode]
        np.testing.assert_array_equal(states[1:, 18:36], states[:-1, :18])


def test_the_expert_labels_a_chunk_of_one_and_refuses_longer_chunks_in_one_line(env):
    observations = env.reset()
    expert = env.expert_actions()
    assert expert.shape == (env.num_envs, 1, 4)
    np.testing.assert_array_equal(expert[:, 0], scripted_expert(TASK)(observations.states))
    longer = MetaWorldVectorEnv(num_envs=1, chunk_size=CHUNK, horizon=HORIZON, task=TASK)
    try:
        with pytest.raises(EnvConfigError, match=r"needs env\.chunk_size=1"):
            longer.expert_actions()
    finally:
        longer.close()
