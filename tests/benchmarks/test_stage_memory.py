"""The planner against what the engines hold: the live-bytes tracker, and one actor rank's
real stages measured with it (benchmarks/stage_memory.py) within 15 % of the plan."""

from __future__ import annotations

import gc

import pytest
import torch

from benchmarks import stage_memory
from benchmarks.harness.live_bytes import LiveBytes
from benchmarks.harness.stage_memory import FusedRMSNorm, stage_peaks


def test_the_tracker_counts_live_storages_once_with_resizes_frees_and_host_memory():
    with LiveBytes() as live:
        weights = torch.empty(1000)  # 4000 bytes
        view = weights.view(10, 100)  # the same storage: not counted twice
        doubled = weights * 2
        assert (live.current, live.peak) == (8000, 8000)
        del doubled
        assert live.current == 4000
        weights.untyped_storage().resize_(0)  # allgather-swap's release
        assert live.current == 0
        weights.untyped_storage().resize_(4000)
        with live.host_allocations():  # a pinned buffer: host memory on an accelerator
            host = torch.empty(500)
        live.host([weights])  # an engine asleep on the host
        assert live.current == 0
        live.host([weights], on_host=False)
        assert live.window("first").peak == 8000
        del weights, view, host
        gc.collect()
        assert live.current == 0 and live.window("second").peak == 4000


def test_the_tracker_leaves_out_storages_from_before_it_even_returned_by_views_and_in_place_ops():
    """A window entered after a warm-up step: the weights' views (a linear's ``weight.t()``)
    and the grads' in-place zeroing hand back storages the window never allocated."""
    weight, grad = torch.randn(1000), torch.ones(1000)
    with LiveBytes() as live:
        weight.t(), weight.view(10, 100), grad.zero_(), grad.add_(weight)
        assert live.current == 0
        product = weight * 2  # a new storage: counted
        values = torch.tensor([1.0, 2.0])  # built outside the dispatcher, lifted: counted
        assert live.current == 4008
        live.adopt([weight])  # counted on purpose, once
        live.adopt([weight])
        assert live.current == 8008
        del product, values
        gc.collect()
        assert live.window("step").peak == 8008 and live.current == 4000


#: Gradient tolerance per dtype: float32 to rounding; bfloat16 to one unit in the last place
#: (2**-7 relative), as the two sum a row's float32 terms in different orders before rounding.
GRAD_TOLERANCE = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (2**-7, 1e-6)}


def test_the_norm_keeps_the_accelerator_kernels_tensors_and_gives_torchs_numbers():
    gen = torch.Generator().manual_seed(0)
    for dtype, (rtol, atol) in GRAD_TOLERANCE.items():
        x = torch.randn(3, 5, 16, generator=gen).to(dtype).requires_grad_()
        w = torch.randn(16, generator=gen).to(dtype).requires_grad_()
        grad = torch.randn(3, 5, 16, generator=gen).to(dtype)
        torch.nn.functional.rms_norm(x, (16,), w, 1e-5).backward(grad)
        expected = (x.grad, w.grad)
        x.grad = w.grad = None
        out = FusedRMSNorm.apply(x, (16,), w, 1e-5)
        assert torch.equal(out, torch.nn.functional.rms_norm(x, (16,), w, 1e-5))
        out.backward(grad)
        torch.testing.assert_close(x.grad, expected[0], rtol=rtol, atol=atol)
        torch.testing.assert_close(w.grad, expected[1], rtol=rtol, atol=atol)


def test_a_stage_is_the_largest_of_its_windows_after_the_first_iteration():
    windows = [
        {"name": "setup", "peak": 50},
        *({"name": n, "peak": p} for n, p in (("rollout:reshard", 99), ("update", 98))),
        {"name": "rollout:reshard", "peak": 10},
        {"name": "rollout:generate", "peak": 12},
        {"name": "rollout", "peak": 11},
        {"name": "update:micro_batches", "peak": 20},
        {"name": "update", "peak": 15},
    ]
    assert stage_peaks(windows) == {
        "rollout:reshard": 10,
        "rollout:generate": 12,
        "rollout": 12,
        "update:micro_batches": 20,
        "update": 20,
    }


def test_the_tiny_recipes_stages_are_within_15_percent_of_the_plan(capsys):
    """The recipe as it ships: two ranks, training TP 2 with sequence parallelism resharded
    to generation TP 1, allgather-swap, the transformers engine."""
    config_path, overrides = stage_memory.SHAPES["tiny-tp2"]
    args = stage_memory.parse_args([])
    result = stage_memory.compare("tiny-tp2", config_path, overrides, args)
    rows = {row["stage"]: row for row in result["rows"]}
    assert set(rows) == {
        "rollout",
        "rollout:reshard",
        "rollout:load",
        "rollout:generate",
        "rollout:swap_in",
        "update",
    }
    for stage in ("rollout", "update"):
        assert rows[stage]["ratio"] == pytest.approx(1.0, abs=0.15), rows[stage]
    # The ledger's own count of the tensors declared to it equals the tracker's.
    assert result["ledger"] and all(c["ledger"] == c["tracker"] for c in result["ledger"])
    assert stage_memory.print_result(result, 0.15)
