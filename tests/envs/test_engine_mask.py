"""The loss mask through the real training engine (a float64 model, one rank): a trajectory's
observation tokens get exactly no gradient, what their fields hold changes nothing, and
packed rows (with shared prompts too) train as the plain rows do."""

from __future__ import annotations

import pytest
import torch

from tests.envs import engine_cases as cases
from tests.support.spawn import run_ranks

EXACT = {"rtol": 1e-12, "atol": 1e-14}


@pytest.fixture(scope="module")
def steps():
    (result,) = run_ranks(cases.every_mode, 1)
    return result


@pytest.mark.parametrize("mode", list(cases.MODES))
def test_an_observation_tokens_gradient_is_exactly_zero_in_the_engine(steps, mode):
    step = steps[mode, False]
    assert step["layout"] == cases.MODES[mode]
    observed = step["mask"] == 0  # observations and the padding past each row
    for key, grad in step["output_grads"].items():
        assert torch.all(grad[observed] == 0.0), key
        assert (grad[step["mask"] > 0] != 0).any(), key


@pytest.mark.parametrize("mode", list(cases.MODES))
def test_what_an_observation_holds_changes_no_weight_gradient(steps, mode):
    calm, wild = steps[mode, False], steps[mode, True]
    assert calm["loss"] == wild["loss"]
    for name, grad in calm["grads"].items():
        assert torch.equal(grad, wild["grads"][name]), name


@pytest.mark.parametrize("mode", ["packed", "shared"])
def test_packed_trajectories_train_like_plain_rows(steps, mode):
    plain, packed = steps["rows", False], steps[mode, False]
    assert packed["loss"] == pytest.approx(plain["loss"], rel=1e-12)
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(packed["grads"][name], grad, **EXACT, msg=name)
