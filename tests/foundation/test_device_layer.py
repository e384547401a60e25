"""Device layer dispatch. NPU and CUDA are absent here, so those tests use a FAKE
torch_npu module and FAKE CUDA availability (clearly labelled below): they check names,
resources, env vars and error messages, not hardware behaviour. The last test runs on
every real platform the machine has (cpu here; cuda / npu skipped with the reason)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from backends.device import DeviceUnavailableError, get_device, resolve_device
from backends.device.registry import reset_device
from tests.support.devices import device_params
from tests.support.spawn import run_ranks


@pytest.fixture(autouse=True)
def fresh_device(monkeypatch):
    monkeypatch.delenv("MINDRL_DEVICE", raising=False)
    reset_device()
    yield
    reset_device()


@pytest.fixture
def fake_torch_npu(monkeypatch):
    """FAKE torch_npu: registers a stand-in `torch.npu` that reports 8 NPUs."""
    fake = types.ModuleType("torch_npu")
    npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 8)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return fake


@pytest.fixture
def fake_cuda(monkeypatch):
    """FAKE CUDA availability on a CPU-only torch."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_this_machine_detects_the_cpu_with_gloo_and_ray_cpu_resources():
    device = get_device()
    assert (device.name, device.dist_backend, device.ray_resource) == ("cpu", "gloo", "CPU")
    assert device.visible_devices_env is None
    assert device.visible_devices_for([0, 1]) == {}
    assert device.shares_host_memory  # its "device" bytes are in the worker's RSS


def test_detection_prefers_npu_when_torch_npu_imports(fake_torch_npu, fake_cuda):
    assert resolve_device() == "npu"
    device = get_device()
    assert (device.dist_backend, device.ray_resource) == ("hccl", "NPU")
    assert not device.shares_host_memory
    assert device.visible_devices_for([2, 3]) == {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}


def test_detection_picks_cuda_without_torch_npu(fake_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import raises ImportError
    device = get_device()
    assert (device.name, device.dist_backend, device.ray_resource) == ("cuda", "nccl", "GPU")
    assert not device.shares_host_memory
    assert device.visible_devices_for([1]) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_a_torch_npu_that_raises_runtime_error_at_import_is_treated_as_absent(monkeypatch):
    class BrokenFinder:
        def find_spec(self, name, path=None, target=None):
            if name == "torch_npu":
                raise RuntimeError("libascendcl.so: cannot open shared object file")
            return None

    monkeypatch.setattr(sys, "meta_path", [BrokenFinder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert resolve_device() == "cpu"
    with pytest.raises(DeviceUnavailableError, match="libascendcl") as err:
        resolve_device("npu")
    assert "\n" not in str(err.value)


def test_an_explicit_npu_request_without_torch_npu_fails_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(DeviceUnavailableError) as err:
        resolve_device("npu")
    message = str(err.value)
    assert "device 'npu' was requested" in message and "--device cpu" in message
    assert "\n" not in message


def test_an_explicit_cuda_request_on_a_cpu_build_names_the_build():
    with pytest.raises(DeviceUnavailableError, match="CPU-only build"):
        resolve_device("cuda")


def test_the_environment_variable_chooses_when_nothing_explicit_is_given(monkeypatch):
    monkeypatch.setenv("MINDRL_DEVICE", "cuda")
    for nothing_in_particular in (None, "auto", " Auto "):  # CLI --device auto, config default
        with pytest.raises(DeviceUnavailableError, match="device 'cuda' was requested"):
            resolve_device(nothing_in_particular)
    assert resolve_device("cpu") == "cpu"  # an explicit choice beats the variable


def test_an_unknown_device_name_lists_the_known_ones():
    with pytest.raises(DeviceUnavailableError, match="choose one of: auto, npu, cuda, cpu"):
        resolve_device("tpu")


def test_cpu_memory_statistics_follow_the_ledger_of_tracked_tensors():
    device = get_device("cpu")
    device.reset_peak_memory_stats()
    base = device.memory_allocated()
    weights = torch.zeros(1000, dtype=torch.float32)
    view = weights[:10]  # shares the storage: counted once
    device.track(weights, view)
    assert device.memory_allocated() - base == 4000
    weights.untyped_storage().resize_(0)
    assert device.memory_allocated() - base == 0
    assert device.max_memory_allocated() - base == 4000
    device.reset_peak_memory_stats()
    assert device.max_memory_allocated() == device.memory_allocated()


def test_a_cpu_worker_computes_on_its_share_of_the_cores(monkeypatch):
    cpu = get_device("cpu")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    before = torch.get_num_threads()
    try:
        assert cpu.use_host_threads(devices_per_node=1) == 8 == torch.get_num_threads()
        assert cpu.use_host_threads(devices_per_node=2) == 4 == torch.get_num_threads()
        assert cpu.use_host_threads(devices_per_node=16) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_cpu_streams_events_and_pinned_buffers_are_usable_no_ops():
    device = get_device("cpu")
    stream = device.new_stream()
    with device.stream(stream):
        event = device.new_event()
        event.record()
    event.wait()
    buffer = device.pinned_empty((3, 4), torch.bfloat16)
    assert buffer.shape == (3, 4) and buffer.dtype == torch.bfloat16
    assert device.device(0) == torch.device("cpu")


def memory_copies_and_streams(rank: int, world: int) -> dict:
    """On the rank's device: allocator statistics, a pinned D2H copy on a side stream."""
    device = get_device()
    device.synchronize()
    base = device.memory_allocated()
    on_device = torch.arange(1 << 20, dtype=torch.float32, device=device.device())
    device.track(on_device)
    grown = device.memory_allocated() - base
    host = device.pinned_empty((1 << 20,), torch.float32)
    with device.stream(device.new_stream()):
        host.copy_(on_device, non_blocking=True)
        copied = device.new_event()
        copied.record()
    copied.synchronize()
    on_device.untyped_storage().resize_(0)  # how the swap releases device storage
    return {
        "device": str(on_device.device),
        "grown": grown,
        "after_release": device.memory_allocated() - base,
        "host_matches": bool(torch.equal(host, torch.arange(1 << 20, dtype=torch.float32))),
        "pinned": host.is_pinned() if device.name != "cpu" else None,
        "backend": torch.distributed.get_backend(),
    }


@pytest.mark.parametrize("device", device_params())
def test_each_platform_counts_device_memory_and_copies_to_pinned_host_on_a_side_stream(device):
    (facts,) = run_ranks(memory_copies_and_streams, 1, device=device)
    assert facts["device"].startswith(device)
    assert facts["backend"] == {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[device]
    assert facts["grown"] >= 4 << 20 and facts["after_release"] == 0
    assert facts["host_matches"] and facts["pinned"] in (None, True)
