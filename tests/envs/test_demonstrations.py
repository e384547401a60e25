"""A demonstration set for the cloned start (mindrl/envs/demonstrations.py): read and
checked against the run's environment in one line, and shuffled into the same batches
however many ranks share them."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mindrl.envs.batched_reach import BatchedReach
from mindrl.envs.demonstrations import load_demonstrations, record_expert
from mindrl.envs.embodied import EnvConfigError, ObservationSpec

SPEC = ObservationSpec(image_height=8, image_width=8, state_dim=3, instruction_vocab=("go",))


def saved(tmp_path, **arrays) -> str:
    path = tmp_path / "demos.npz"
    np.savez(path, **arrays)
    return str(path)


def test_pairs_of_single_actions_are_read_as_chunks_of_one(tmp_path):
    states, actions = np.ones((5, 3)), np.linspace(-1, 1, 10).reshape(5, 2)
    demos = load_demonstrations(saved(tmp_path, states=states, actions=actions), SPEC, 1, 2)
    assert demos.actions.shape == (5, 1, 2) and demos.states.dtype == np.float32
    assert demos.images is None and demos.instruction_ids is None
    np.testing.assert_allclose(demos.actions[:, 0], actions)


@pytest.mark.parametrize(
    ("arrays", "line"),
    [
        ({"states": np.ones((5, 3))}, "has no actions array; it needs states and actions"),
        ({"states": np.ones((5, 4)), "actions": np.ones((5, 2))}, "states is [5, 4]; this run"),
        ({"states": np.ones((5, 3)), "actions": np.ones((5, 3))}, "actions is [5, 1, 3]; this"),
        (
            {"states": np.ones((5, 3)), "actions": np.ones((5, 2)), "images": np.ones((5, 4, 4))},
            "images is [5, 4, 4]; this run reads [5, 8, 8, 3]",
        ),
    ],
)
def test_a_set_that_does_not_fit_the_run_is_refused_in_one_line(tmp_path, arrays, line):
    with pytest.raises(EnvConfigError, match=re.escape(line)):
        load_demonstrations(saved(tmp_path, **arrays), SPEC, 1, 2)


def test_a_missing_or_unreadable_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(EnvConfigError, match="is not a file; write one with scripts/"):
        load_demonstrations(str(tmp_path / "none.npz"), SPEC, 1, 2)
    (tmp_path / "bad.npz").write_text("not numpy")
    with pytest.raises(EnvConfigError, match=r"is not an \.npz file numpy can read"):
        load_demonstrations(str(tmp_path / "bad.npz"), SPEC, 1, 2)


def test_ranks_share_each_steps_shuffled_batch_and_steps_differ(tmp_path):
    path = saved(tmp_path, states=np.ones((100, 3)), actions=np.ones((100, 2)))
    demos = load_demonstrations(path, SPEC, 1, 2)
    whole = demos.batch_rows(step=4, seed=1, size=12, rank=0, ranks=1)
    shares = [demos.batch_rows(step=4, seed=1, size=12, rank=r, ranks=3) for r in range(3)]
    assert sorted(np.concatenate(shares).tolist()) == sorted(whole.tolist())
    assert len(set(whole.tolist())) == 12  # no pair twice in a batch
    assert set(whole.tolist()) != set(demos.batch_rows(5, 1, 12, 0, 1).tolist())


def test_a_recorded_expert_is_a_set_the_run_loads_with_its_images_and_instructions(tmp_path):
    env = BatchedReach(num_envs=4, chunk_size=2, horizon=8, auto_reset=True, seed=3)
    data = record_expert(env, episodes=5, images=True)
    pairs = data["episode"].size
    assert data["success"].shape == (5,) and data["success"].mean() >= 0.6
    assert data["actions"].shape == (pairs, 2, 2) and data["images"].shape == (pairs, 32, 32, 3)
    assert data["instruction_ids"].shape[0] == pairs
    path = tmp_path / "reach.npz"
    np.savez(path, **data)
    demos = load_demonstrations(str(path), env.observation_spec, chunk_size=2, action_dims=2)
    np.testing.assert_array_equal(demos.images, data["images"])
    np.testing.assert_array_equal(demos.actions, data["actions"].astype(np.float32))
