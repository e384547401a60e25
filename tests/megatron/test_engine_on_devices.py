"""The training engine on accelerators: the steps tests/megatron checks on the CPU, run on
CUDA / NPU (NCCL / HCCL), equal the same step computed on the CPU.

Here (no accelerator) every test is skipped with the device layer's reason; on a GPU or
NPU machine they are the first check of the accelerator code paths: the engine on one
device, tensor parallelism with sequence parallelism, Megatron's pipeline schedule
(the CPU uses the engine's own loop instead), expert parallelism.
"""

from __future__ import annotations

import pytest

from backends.megatron import ParallelSpec
from tests.megatron import cases
from tests.support.devices import device_params
from tests.support.spawn import run_ranks

ACCELERATORS = ("cuda", "npu")
#: fp32 on both sides; accelerator kernels sum in other orders than the CPU's.
TOL = {"rtol": 1e-3, "atol": 1e-4}

LAYOUTS = {
    "dense": (cases.DENSE, ParallelSpec(), False),
    "moe": (cases.MOE, ParallelSpec(), False),
    "dense_tp2": (cases.DENSE, ParallelSpec(tp=2), False),
    "dense_pp2": (cases.DENSE, ParallelSpec(pp=2), False),
    "dense_dp2": (cases.DENSE, ParallelSpec(), True),
    "moe_tp2_ep2": (cases.MOE, ParallelSpec(tp=2, ep=2), True),
}


@pytest.fixture(scope="module")
def cpu_reference() -> dict:
    """One step of each model on one CPU rank (only built when a test here runs)."""
    (dense,) = run_ranks(cases.layout_step, 1, cases.DENSE, ParallelSpec(), False)
    (moe,) = run_ranks(cases.layout_step, 1, cases.MOE, ParallelSpec(), False)
    return {"dense": dense, "moe": moe}


def assert_same_step(result: dict, reference: dict) -> None:
    cases.assert_same_step(result, reference, tol=TOL, scalar_rel=TOL["rtol"])


@pytest.mark.parametrize("layout", ["dense", "moe"])
@pytest.mark.parametrize("device", device_params(ranks=1, platforms=ACCELERATORS))
def test_one_step_on_one_accelerator_equals_the_cpu_step(cpu_reference, device, layout):
    spec, parallel, dp_split = LAYOUTS[layout]
    (result,) = run_ranks(cases.layout_step, 1, spec, parallel, dp_split, device=device)
    assert result["device"] == "cpu"  # moved back by run_ranks; computed on the device
    assert_same_step(result, cpu_reference[layout])


@pytest.mark.parametrize("layout", ["dense_tp2", "dense_pp2", "dense_dp2", "moe_tp2_ep2"])
@pytest.mark.parametrize("device", device_params(ranks=2, platforms=ACCELERATORS))
def test_a_two_device_layout_equals_the_one_rank_cpu_step(cpu_reference, device, layout):
    spec, parallel, dp_split = LAYOUTS[layout]
    for result in run_ranks(cases.layout_step, 2, spec, parallel, dp_split, device=device):
        assert_same_step(result, cpu_reference[layout.split("_")[0]])
