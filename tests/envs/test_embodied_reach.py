"""BatchedReach: the batch moves as one, draws per environment, and the blind bounds of its
docstring hold against the best scripted blind strategies while an oracle always succeeds."""

from __future__ import annotations

import numpy as np
import pytest

from mindrl.envs.batched_reach import VOCAB, BatchedReach
from mindrl.envs.embodied import Observations, VectorEnv

CHUNK, HORIZON, SPEED = 4, 12, 0.2


def make(num_envs: int, **kwargs) -> BatchedReach:
    kwargs = {"chunk_size": CHUNK, "horizon": HORIZON, "seed": 7, **kwargs}
    return BatchedReach(num_envs=num_envs, **kwargs)


def random_actions(num_envs: int, chunks: int, chunk: int = CHUNK, seed: int = 0) -> np.ndarray:
    """``[chunks, num_envs, chunk, 2]`` velocities, some beyond the bounds (clipped)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.5 * SPEED, 1.5 * SPEED, size=(chunks, num_envs, chunk, 2))


def heading_for(env: BatchedReach, goals: np.ndarray) -> np.ndarray:
    """A chunk moving each end effector straight at ``goals`` ``[n, 2]`` at full speed."""
    position, chunk = env._position.copy(), []
    for _ in range(env.chunk_size):
        delta = goals - position
        step = delta / np.maximum(np.abs(delta).max(axis=1, keepdims=True) / SPEED, 1.0)
        position = position + step
        chunk.append(step)
    return np.stack(chunk, axis=1)


def episode_success(env: BatchedReach, policy) -> float:
    """The share of ``env``'s fixed-length episodes that ``policy(env, chunk_index)``
    brings to success."""
    env.reset()
    success = np.zeros(env.num_envs, dtype=bool)
    for index in range(env.horizon // env.chunk_size):
        success |= env.chunk_step(policy(env, index))[4]["success"]
    return float(success.mean())


def assert_same_observations(a: Observations, b: Observations) -> None:
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.states, b.states)
    np.testing.assert_array_equal(a.instruction_ids, b.instruction_ids)
    assert a.instructions == b.instructions


def assert_same_outputs(a: tuple, b: tuple) -> None:
    """Two ``chunk_step`` outputs (or ``(reset observations,)``) are equal."""
    assert_same_observations(a[0], b[0])
    for x, y in zip(a[1:4], b[1:4], strict=True):
        np.testing.assert_array_equal(x, y)
    if len(a) > 4:
        assert_same_observations(a[4]["final_observations"], b[4]["final_observations"])
        for key in ("success", "valid"):
            np.testing.assert_array_equal(a[4][key], b[4][key])


def joined(parts: list[tuple]) -> tuple:
    """The outputs of sub-batches as one batch's."""
    observations = [
        Observations(
            images=np.concatenate([p[0].images for p in parts]),
            states=np.concatenate([p[0].states for p in parts]),
            instructions=[text for p in parts for text in p[0].instructions],
            instruction_ids=np.concatenate([p[0].instruction_ids for p in parts]),
        )
    ]
    arrays = [np.concatenate([p[i] for p in parts]) for i in range(1, min(len(parts[0]), 4))]
    if len(parts[0]) <= 4:
        return (*observations, *arrays)
    info = {key: np.concatenate([p[4][key] for p in parts]) for key in ("success", "valid")}
    info["final_observations"] = joined([(p[4]["final_observations"],) for p in parts])[0]
    return (*observations, *arrays, info)


def roll(env: BatchedReach, actions: np.ndarray) -> list[tuple]:
    """``(first observations,)`` then every ``chunk_step`` output over ``actions``' chunks."""
    return [(env.reset(),)] + [env.chunk_step(chunk) for chunk in actions]


def test_observations_and_step_outputs_have_the_interface_shapes_and_dtypes():
    env = make(5, image_size=24)
    assert isinstance(env, VectorEnv)
    assert env.observation_spec.instruction_vocab == VOCAB
    first = env.reset()
    assert first.images.shape == (5, 24, 24, 3) and first.images.dtype == np.uint8
    assert first.states.shape == (5, 2) and first.states.dtype == np.float32
    assert first.instruction_ids.shape == (5, 4) and first.instruction_ids.dtype == np.int64
    assert all(text.startswith("reach the ") for text in first.instructions)
    words = [" ".join(VOCAB[i] for i in ids) for ids in first.instruction_ids]
    assert words == first.instructions
    observations, rewards, terminations, truncations, info = env.chunk_step(random_actions(5, 1)[0])
    assert observations.images.shape == (5, 24, 24, 3)
    assert rewards.shape == (5, CHUNK) and rewards.dtype == np.float32
    assert terminations.shape == truncations.shape == info["valid"].shape == (5, CHUNK)
    assert terminations.dtype == truncations.dtype == np.bool_
    assert info["success"].shape == (5,) and info["success"].dtype == np.bool_


def test_the_image_shows_each_target_in_its_colour_and_the_effector_at_the_centre():
    env = make(1, image_size=32)
    image = env.reset().images[0]
    assert (image[15:17, 15:17] == 255).all()  # the effector starts at the centre
    for k in range(3):
        x, y = env.target_positions[0, k]
        row, col = int((1 - y) / 2 * 32), int((x + 1) / 2 * 32)
        colour = [[220, 40, 40], [40, 200, 40], [50, 90, 235]][env._colour_of_target[0, k]]
        assert image[row, col].tolist() == colour


def test_a_batch_of_n_equals_n_single_environments_with_the_same_numbers():
    actions = random_actions(6, 7)
    batch = roll(make(6), actions)
    singles = [roll(make(1, first_env_id=i), actions[:, i : i + 1]) for i in range(6)]
    for step, outputs in enumerate(batch):
        assert_same_outputs(outputs, joined([single[step] for single in singles]))


def test_two_sub_simulators_reproduce_the_whole_one():
    actions = random_actions(8, 6, seed=3)
    whole = roll(make(8), actions)
    halves = [roll(make(4, first_env_id=4 * h), actions[:, 4 * h : 4 * h + 4]) for h in (0, 1)]
    for step, outputs in enumerate(whole):
        assert_same_outputs(outputs, joined([half[step] for half in halves]))


def test_the_same_seed_gives_the_same_episodes_and_another_seed_others():
    actions = random_actions(4, 5)
    one, two, other = (roll(make(4, seed=seed), actions) for seed in (11, 11, 12))
    for a, b in zip(one, two, strict=True):
        assert_same_outputs(a, b)
    assert not np.array_equal(one[0][0].images, other[0][0].images)


def test_a_chunk_of_c_actions_equals_c_single_action_steps():
    actions = random_actions(5, 3, seed=4)  # three chunks of four: a whole episode
    chunked = make(5, auto_reset=False)
    single = make(5, auto_reset=False, chunk_size=1)
    chunked.reset(), single.reset()
    for chunk in actions:
        observations, rewards, terminations, truncations, info = chunked.chunk_step(chunk)
        steps = [single.chunk_step(chunk[:, c : c + 1]) for c in range(CHUNK)]
        np.testing.assert_array_equal(rewards, np.concatenate([s[1] for s in steps], axis=1))
        np.testing.assert_array_equal(terminations, np.concatenate([s[2] for s in steps], 1))
        np.testing.assert_array_equal(truncations, np.concatenate([s[3] for s in steps], 1))
        success = np.any([s[4]["success"] for s in steps], axis=0)
        np.testing.assert_array_equal(info["success"], success)
        assert_same_observations(observations, steps[-1][0])


def test_an_episode_ends_at_the_horizon_and_later_actions_are_not_applied():
    env = make(3, auto_reset=False)
    env.reset()
    still = np.zeros((3, CHUNK, 2))
    for _ in range(HORIZON // CHUNK - 1):
        assert not env.chunk_step(still)[3].any()
    _, rewards, terminations, truncations, info = env.chunk_step(still)
    assert truncations[:, -1].all() and not terminations.any()
    observations, rewards, _, truncations, info = env.chunk_step(random_actions(3, 1)[0])
    assert not info["valid"].any() and not truncations.any() and not rewards.any()
    np.testing.assert_array_equal(observations.states, np.zeros((3, 2), np.float32))


def test_auto_reset_restarts_only_the_environments_whose_episode_ended():
    env = make(4)
    env.reset()
    goals = env.goal_positions
    actions = heading_for(env, goals)
    actions[2:] = 0.0  # environments 2 and 3 stand still: their episodes go on
    observations, _, terminations, _, info = env.chunk_step(actions)
    assert terminations[:2].any(axis=1).all() and info["success"][:2].all()
    np.testing.assert_array_equal(observations.states[:2], np.zeros((2, 2), np.float32))
    assert not np.array_equal(env.goal_positions[:2], goals[:2])  # new episodes
    np.testing.assert_array_equal(env.goal_positions[2:], goals[2:])
    final = info["final_observations"].states  # where the old episodes ended: at their goal
    assert (np.linalg.norm(final[:2] - goals[:2], axis=1) < env.success_radius).all()


def test_a_partial_reset_leaves_the_other_environments_as_they_are():
    env = make(4, auto_reset=False)
    env.reset()
    env.chunk_step(random_actions(4, 1)[0])
    before_positions, before_targets = env._position.copy(), env.target_positions
    first = env.reset(env_ids=np.array([2, 0]))
    assert len(first) == 2
    np.testing.assert_array_equal(env._position[[1, 3]], before_positions[[1, 3]])
    np.testing.assert_array_equal(env.target_positions[[1, 3]], before_targets[[1, 3]])
    np.testing.assert_array_equal(first.states, np.zeros((2, 2), np.float32))
    assert not np.array_equal(env.target_positions[[0, 2]], before_targets[[0, 2]])


def test_group_members_given_one_reset_state_id_start_identical_and_groups_differ():
    env = make(6)
    first = env.reset(reset_state_ids=np.array([5, 5, 5, 9, 9, 9]))
    for group in (slice(0, 3), slice(3, 6)):
        assert (first.images[group] == first.images[group][:1]).all()
        assert len(set(first.instructions[group])) == 1
    assert not np.array_equal(first.images[0], first.images[3])
    again = make(6, first_env_id=100).reset(reset_state_ids=np.array([9, 9, 9, 5, 5, 5]))
    np.testing.assert_array_equal(again.images[0], first.images[3])  # not tied to the env


def test_rewards_are_the_progress_to_the_named_target_plus_one_on_success():
    env = make(64, auto_reset=False)
    env.reset()
    start = np.linalg.norm(env.goal_positions, axis=1)  # the effector starts at the centre
    _, rewards, terminations, _, info = env.chunk_step(heading_for(env, env.goal_positions))
    assert info["success"].all() and (terminations.sum(axis=1) == 1).all()
    end = np.linalg.norm(info["final_observations"].states - env.goal_positions, axis=1)
    np.testing.assert_allclose(rewards.sum(axis=1), start - end + 1.0, rtol=1e-5)
    sparse = make(64, auto_reset=False, shaping=0.0)
    sparse.reset()
    _, rewards, terminations, _, _ = sparse.chunk_step(heading_for(sparse, sparse.goal_positions))
    np.testing.assert_array_equal(rewards, terminations.astype(np.float32))


def test_touching_another_target_ends_the_episode_without_success():
    env = make(64, auto_reset=False)
    env.reset()
    other = env.target_positions[np.arange(64), (env._goal + 1) % 3]
    _, rewards, terminations, _, info = env.chunk_step(heading_for(env, other))
    assert (terminations.sum(axis=1) == 1).all() and not info["success"].any()
    assert (rewards < 1.0).all()


def test_the_scripted_expert_heads_straight_for_the_named_target_and_always_succeeds():
    env = make(1024, seed=1, auto_reset=False)
    env.reset()
    np.testing.assert_allclose(env.expert_actions(), heading_for(env, env.goal_positions))
    assert episode_success(env, lambda env, _: env.expert_actions()) == 1.0


def test_an_instruction_blind_policy_reaching_the_nearest_target_succeeds_a_third_of_the_time():
    env = make(4096, seed=2, auto_reset=False)

    def nearest(env: BatchedReach, _: int) -> np.ndarray:
        distances = np.linalg.norm(env.target_positions - env._position[:, None], axis=-1)
        nearest_target = env.target_positions[np.arange(env.num_envs), distances.argmin(1)]
        return heading_for(env, nearest_target)

    assert abs(episode_success(env, nearest) - 1 / 3) < 0.025  # 3.4 standard deviations


def test_an_image_blind_sweep_stays_under_the_image_blind_bound():
    env = make(4096, seed=3, auto_reset=False)
    bound = HORIZON * env.success_radius**2 / (env.ring_outer**2 - env.ring_inner**2)
    assert bound == pytest.approx(1 / 6)
    path = _sweep(radius=0.5)  # the same path whatever the instruction: it cannot help

    def sweep(env: BatchedReach, index: int) -> np.ndarray:
        chunk = path[index * CHUNK : (index + 1) * CHUNK]
        return np.broadcast_to(chunk, (env.num_envs, CHUNK, 2)).copy()

    success = episode_success(env, sweep)
    assert 0.1 < success < bound  # near the bound, so the bound is close to what blind can do


def _sweep(radius: float) -> np.ndarray:
    """``[HORIZON, 2]`` velocities: out to the ring, then round it, one success disc
    after another without overlap (the union of discs the bound counts)."""
    position, steps, angle = np.zeros(2), [], 0.0
    while len(steps) < HORIZON:
        if np.linalg.norm(position) < radius - SPEED:
            goal = position + np.array([SPEED, 0.0])
        else:
            angle += SPEED / radius
            goal = radius * np.array([np.cos(angle), np.sin(angle)])
        step = (goal - position) / max(np.abs(goal - position).max() / SPEED, 1.0)
        position = position + step
        steps.append(step)
    return np.array(steps)


def test_a_blinded_reach_withholds_the_targets_or_the_colour_and_nothing_else():
    seeing = make(8, seed=4)
    image_blind, instruction_blind = (
        make(8, seed=4, blind="image"),
        make(8, seed=4, blind="instruction"),
    )
    seen, no_targets, no_colour = seeing.reset(), image_blind.reset(), instruction_blind.reset()
    assert {tuple(c) for c in no_targets.images.reshape(-1, 3)} == {(30, 30, 30), (255, 255, 255)}
    assert no_targets.instructions == seen.instructions
    assert set(no_colour.instructions) == {"reach the the target"}
    np.testing.assert_array_equal(no_colour.images, seen.images)
    np.testing.assert_array_equal(image_blind.goal_positions, seeing.goal_positions)
    with pytest.raises(ValueError, match="blind='colour'"):
        make(8, blind="colour")


def test_a_finer_render_is_averaged_down_to_anti_aliased_edges_of_the_same_scene():
    plain, fine = make(8), make(8, render_scale=4)
    coarse, smooth = plain.reset().images.astype(int), fine.reset().images.astype(int)
    assert smooth.shape == coarse.shape == (8, 32, 32, 3)
    np.testing.assert_array_equal(fine.target_positions, plain.target_positions)
    # Only edge pixels differ (a disc's border is partly covered), and some take a
    # colour between the background's and a target's, which one sample per pixel cannot.
    differs = (smooth != coarse).any(axis=-1)
    assert 0 < differs.mean() < 0.1
    background = np.array([30, 30, 30])
    blended = ~(smooth == background).all(-1) & ~np.isin(smooth, [40, 50, 200, 220, 235, 255]).all(
        -1
    )
    assert blended.any()
