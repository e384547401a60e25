"""Ascend NPUs through ``torch_npu``: HCCL, Ray ``NPU`` resources, ASCEND_RT_VISIBLE_DEVICES.

``torch_npu`` is imported lazily and only here. Importing it on a machine without CANN
raises ``RuntimeError`` (or breaks at import), so detection catches both.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch

from backends.device.base import Device


def _import_torch_npu() -> Any:
    return importlib.import_module("torch_npu")


class NpuDevice(Device):
    """Ascend NPU device. Memory statistics are the NPU caching allocator's."""

    name = "npu"
    torch_device_type = "npu"
    dist_backend = "hccl"
    ray_resource = "NPU"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"

    def __init__(self) -> None:
        _import_torch_npu()  # registers torch.npu

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            _import_torch_npu()
        except (ImportError, RuntimeError) as exc:
            return (
                f"torch_npu cannot be imported ({type(exc).__name__}: {exc}); install CANN and "
                "the torch-npu matching your torch, or choose --device cpu/cuda"
            )
        if not torch.npu.is_available():
            return "torch_npu imports but sees no NPU (check npu-smi and ASCEND_RT_VISIBLE_DEVICES)"
        return None

    def device_count(self) -> int:
        return torch.npu.device_count()

    def current_index(self) -> int:
        return torch.npu.current_device()

    def set_device(self, index: int) -> None:
        torch.npu.set_device(index)

    def synchronize(self) -> None:
        torch.npu.synchronize()

    def new_stream(self) -> Any:
        return torch.npu.Stream()

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if stream is None else torch.npu.stream(stream)

    def new_event(self) -> Any:
        return torch.npu.Event()

    def pinned_empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def memory_allocated(self) -> int:
        return torch.npu.memory_allocated()

    def max_memory_allocated(self) -> int:
        return torch.npu.max_memory_allocated()

    def reset_peak_memory_stats(self) -> None:
        torch.npu.reset_peak_memory_stats()

    def empty_cache(self) -> None:
        torch.npu.empty_cache()

    def total_memory(self) -> int:
        return torch.npu.get_device_properties(self.current_index()).total_memory
