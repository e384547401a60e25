"""The vector environment interface: the action spec, the action tokenizer and the loader
of a VectorEnv class."""

from __future__ import annotations

import numpy as np
import pytest

from mindrl.envs.action_tokenizer import ActionTokenizer
from mindrl.envs.batched_reach import BatchedReach
from mindrl.envs.embodied import (
    ActionSpec,
    EnvConfigError,
    load_vector_env_class,
    make_vector_env,
)

REACH = "mindrl.envs.batched_reach:BatchedReach"
SPEC = ActionSpec(3, np.array([-0.2, 0.0, -5.0]), np.array([0.2, 1.0, 5.0]))


def test_the_action_spec_maps_its_bounds_onto_minus_one_to_one_and_back():
    corners = np.stack([SPEC.low, SPEC.high, (SPEC.low + SPEC.high) / 2])
    np.testing.assert_allclose(SPEC.normalize(corners), [[-1] * 3, [1] * 3, [0] * 3], atol=1e-6)
    actions = np.random.default_rng(0).uniform(SPEC.low, SPEC.high, size=(4, 5, 3))
    np.testing.assert_allclose(SPEC.denormalize(SPEC.normalize(actions)), actions, atol=1e-5)
    np.testing.assert_array_equal(SPEC.clip([[9.0, -9.0, 1.0]]), np.float32([[0.2, 0.0, 1.0]]))


def test_an_action_spec_with_bounds_that_do_not_match_is_refused():
    with pytest.raises(ValueError, match="low and high must be 2 values each with high > low"):
        ActionSpec(2, np.zeros(2), np.array([1.0, 0.0]))


def test_action_ids_are_the_last_bins_of_the_vocabulary_and_decode_back_exactly():
    tokenizer = ActionTokenizer(vocab_size=1000, bins=256, low=SPEC.low, high=SPEC.high)
    ids = np.arange(744, 1000).reshape(-1, 1).repeat(3, axis=1)  # every bin, each dimension
    np.testing.assert_array_equal(tokenizer.actions_to_ids(tokenizer.ids_to_actions(ids)), ids)
    np.testing.assert_array_equal(
        tokenizer.actions_to_ids(np.stack([SPEC.low, SPEC.high])), [[744] * 3, [999] * 3]
    )
    assert tokenizer.is_action_id(np.array([743, 744, 999, 1000])).tolist() == [
        False,
        True,
        True,
        False,
    ]


def test_actions_come_back_from_their_ids_within_half_a_bin():
    tokenizer = ActionTokenizer(vocab_size=300, bins=256, low=SPEC.low, high=SPEC.high)
    actions = np.random.default_rng(1).uniform(SPEC.low, SPEC.high, size=(64, 4, 3))
    ids = tokenizer.actions_to_ids(actions)
    assert ids.shape == actions.shape and tokenizer.is_action_id(ids).all()
    error = np.abs(tokenizer.ids_to_actions(ids) - actions)
    assert (error <= tokenizer.bin_width / 2 + 1e-6).all()
    assert (error.max(axis=(0, 1)) > tokenizer.bin_width / 4).all()  # bins, not identity


def test_the_action_tokenizer_refuses_what_is_no_action_id_and_too_small_a_vocabulary():
    tokenizer = ActionTokenizer(vocab_size=300, bins=256)
    with pytest.raises(ValueError, match=r"id 12 is no action id \(they are 44..299\)"):
        tokenizer.ids_to_actions(np.array([50, 12]))
    with pytest.raises(ValueError, match="needs 2 <= bins < vocab_size"):
        ActionTokenizer(vocab_size=256, bins=256)


def test_a_vector_env_class_loads_and_builds_with_the_run_sizes_and_its_kwargs():
    assert load_vector_env_class(REACH) is BatchedReach
    env = make_vector_env(
        REACH, num_envs=3, chunk_size=2, horizon=8, seed=5, kwargs={"image_size": 16}
    )
    assert (env.num_envs, env.chunk_size, env.horizon, env.seed) == (3, 2, 8, 5)
    assert env.reset().images.shape == (3, 16, 16, 3)


@pytest.mark.parametrize(
    ("path", "kwargs", "message"),
    [
        ("mindrl.envs.recall:RecallEnv", {}, "needs a subclass of mindrl.envs.embodied.VectorEnv"),
        ("mindrl.envs.nowhere:Reach", {}, "cannot import 'mindrl.envs.nowhere'"),
        ("mindrl.envs.batched_reach:Reacher", {}, "has no class 'Reacher'"),
        (REACH, {"colour": "red"}, r"refuses env.kwargs \{'colour': 'red'\}"),
    ],
)
def test_a_wrong_vector_env_is_refused_in_one_line(path, kwargs, message):
    with pytest.raises(EnvConfigError, match=message) as err:
        make_vector_env(path, num_envs=2, chunk_size=4, horizon=12, kwargs=kwargs)
    assert "\n" not in str(err.value)


def test_chunks_that_do_not_tile_the_horizon_are_refused_when_built():
    with pytest.raises(EnvConfigError, match=r"env\.chunk_size=5 does not divide env\.horizon=12"):
        BatchedReach(num_envs=2, chunk_size=5, horizon=12)
