"""How ``run_ranks`` starts its ranks: forked from a preloaded server only where no
accelerator exists, since a process forked after CUDA was asked anything fails its next
device call (torch's optimizer makes one even for CPU tensors)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from benchmarks.harness import spawn


def test_cpu_ranks_are_forked_from_the_preloaded_server_on_a_machine_without_accelerators(
    monkeypatch,
):
    monkeypatch.setattr(spawn, "available_devices", lambda: ["cpu"])
    assert spawn._start_context("cpu").get_start_method() == "forkserver"


def test_cpu_ranks_are_spawned_on_a_machine_with_a_gpu(monkeypatch):
    monkeypatch.setattr(spawn, "available_devices", lambda: ["cuda", "cpu"])  # FAKE GPU
    assert spawn._start_context("cpu").get_start_method() == "spawn"


def killed(rank: int, world: int) -> int:
    # As the OOM killer or a segfault ends a process: no except clause runs, nothing is
    # put on the queue, and no peer is left to notice in a collective.
    os.kill(os.getpid(), signal.SIGKILL)
    return rank


def test_a_rank_killed_by_a_signal_fails_the_call_at_once_naming_it():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0 died without a result \(signal SIGKILL\)"):
        spawn.run_ranks(killed, 1, threads=1)
    assert time.monotonic() - started < 60  # not the queue's wait until the test's timeout
