"""NVIDIA GPUs through ``torch.cuda``: NCCL, Ray ``GPU`` resources, CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from backends.device.base import Device


class CudaDevice(Device):
    """CUDA device. Memory statistics are the caching allocator's."""

    name = "cuda"
    torch_device_type = "cuda"
    dist_backend = "nccl"
    ray_resource = "GPU"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    #: The cuBLAS workspace of a process's first bf16 matmul, kept by the caching
    #: allocator for the process's life: 64 MiB on an H100 (torch 2.11, sm90, measured
    #: 2026-11-27), another 64 MiB for each side stream that multiplies.
    library_workspace_bytes = 64 * 2**20

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not torch.cuda.is_available():
            build = torch.version.cuda
            if build is None:
                return (
                    f"torch {torch.__version__} is a CPU-only build; install a CUDA build of "
                    "torch or choose --device cpu"
                )
            return (
                f"torch was built for CUDA {build} but no GPU is visible "
                "(check nvidia-smi and CUDA_VISIBLE_DEVICES) or choose --device cpu"
            )
        return None

    #: NCCL moves the weights GPU to GPU (the base class: gloo through the host).
    transfer_on_device = True

    def transfer_group(self, store: Any, rank: int, size: int, timeout_s: float = 300.0) -> Any:
        import datetime

        import torch.distributed as dist

        options = dist.ProcessGroupNCCL.Options()
        options._timeout = datetime.timedelta(seconds=timeout_s)
        return dist.ProcessGroupNCCL(dist.PrefixStore("weights", store), rank, size, options)

    def ray_actor_options(self, cpus_per_worker: float = 1.0, device_share: float = 1.0) -> dict:
        # GPUs are Ray's built-in resource: num_gpus makes Ray set CUDA_VISIBLE_DEVICES
        # (to the same GPU for every fractional share of one bundle's GPU).
        return {"num_cpus": cpus_per_worker, "num_gpus": device_share}

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_index(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def new_stream(self) -> Any:
        return torch.cuda.Stream()

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def profiler_activities(self) -> list[Any]:
        return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]

    def pinned_empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated()

    def max_memory_allocated(self) -> int:
        return torch.cuda.max_memory_allocated()

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def total_memory(self) -> int:
        return torch.cuda.get_device_properties(self.current_index()).total_memory
