"""How ``run_ranks`` starts its ranks: forked from a preloaded server only where no
accelerator exists, since a process forked after CUDA was asked anything fails its next
device call (torch's optimizer makes one even for CPU tensors)."""

from __future__ import annotations

from benchmarks.harness import spawn


def test_cpu_ranks_are_forked_from_the_preloaded_server_on_a_machine_without_accelerators(
    monkeypatch,
):
    monkeypatch.setattr(spawn, "available_devices", lambda: ["cpu"])
    assert spawn._start_context("cpu").get_start_method() == "forkserver"


def test_cpu_ranks_are_spawned_on_a_machine_with_a_gpu(monkeypatch):
    monkeypatch.setattr(spawn, "available_devices", lambda: ["cuda", "cpu"])  # FAKE GPU
    assert spawn._start_context("cpu").get_start_method() == "spawn"
