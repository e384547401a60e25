"""The step profile train_step.py attaches with ``--profile``: the costliest operators."""

from __future__ import annotations

import torch

from backends.device import get_device
from benchmarks.harness.profile import profile_steps


def test_a_profiled_step_ranks_its_matmul_first_with_per_step_figures():
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def step() -> None:
        for _ in range(4):
            a @ b
        a + b

    table = profile_steps(step, steps=2, device=get_device("cpu"), top=3)
    assert table["timed_on"] == "host"
    top = table["top"][0]
    assert top["name"] in ("aten::matmul", "aten::mm")
    assert top["calls_per_step"] == 4.0
    assert 0 < top["ms_per_step"] <= table["busy_ms_per_step"]
    assert len(table["top"]) == 3
    assert sum(row["share"] for row in table["top"]) <= 1.0
