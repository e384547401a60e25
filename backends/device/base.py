"""The device interface every platform module implements."""

from __future__ import annotations

import contextlib
import datetime
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.distributed as dist


class DeviceUnavailableError(RuntimeError):
    """An explicitly requested device cannot be used on this machine."""


class Device(ABC):
    """Everything mindrl needs to know about one kind of device, and nothing more.

    Attributes:
        name: mindrl's name for the platform: ``"cpu"``, ``"cuda"`` or ``"npu"``.
        torch_device_type: the ``torch.device`` type string.
        dist_backend: torch.distributed backend (``gloo``, ``nccl``, ``hccl``).
        ray_resource: Ray resource name workers ask for (``CPU``, ``GPU``, ``NPU``).
        visible_devices_env: environment variable that restricts visible devices, or
            ``None`` when the platform has none (CPU).
        shares_host_memory: the device's memory is the host's (CPU), so a worker's
            resident size holds its "device" tensors too.
        library_workspace_bytes: device memory a process's math libraries take from the
            allocator on first use and keep (cuBLAS's workspace), beside every tensor the
            planner sizes; 0 where it is none or not yet measured.
    """

    name: str
    torch_device_type: str
    dist_backend: str
    ray_resource: str
    visible_devices_env: str | None
    shares_host_memory: bool = False
    library_workspace_bytes: int = 0

    # ---- availability -------------------------------------------------------------
    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """Return ``None`` when usable here, else one line saying why not and the fix."""

    @classmethod
    def is_available(cls) -> bool:
        return cls.unavailable_reason() is None

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices visible to this process."""

    # ---- placement ----------------------------------------------------------------
    def device(self, index: int | None = None) -> torch.device:
        """The ``torch.device`` for local device ``index`` (current device if None)."""
        if index is None:
            index = self.current_index()
        return torch.device(self.torch_device_type, index)

    @abstractmethod
    def current_index(self) -> int:
        """Index of the current device of this process."""

    @abstractmethod
    def set_device(self, index: int) -> None:
        """Make local device ``index`` current for this process."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all queued work on the current device."""

    # ---- streams and events (no-ops on CPU) -------------------------------------------
    @abstractmethod
    def new_stream(self) -> Any:
        """A side stream for overlapping copies with compute; ``None`` on CPU."""

    @abstractmethod
    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        """Context manager that makes ``stream`` current (no-op for ``None``)."""

    @abstractmethod
    def new_event(self) -> Any:
        """An event that can be recorded on a stream and waited on."""

    def profiler_activities(self) -> list[Any]:
        """What ``torch.profiler`` records here: the host's operators, and the device's
        kernels where torch's profiler can see them."""
        return [torch.profiler.ProfilerActivity.CPU]

    # ---- host memory ---------------------------------------------------------------
    @abstractmethod
    def pinned_empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised page-locked host tensor (plain host memory on CPU)."""

    # ---- memory statistics ----------------------------------------------------------
    @abstractmethod
    def memory_allocated(self) -> int:
        """Bytes of device memory held by tensors right now."""

    @abstractmethod
    def max_memory_allocated(self) -> int:
        """Peak of :meth:`memory_allocated` since the last reset."""

    @abstractmethod
    def reset_peak_memory_stats(self) -> None:
        """Start a new peak window."""

    @abstractmethod
    def total_memory(self) -> int:
        """Capacity of one device in bytes."""

    def track(self, *tensors: torch.Tensor) -> None:
        """Declare tensors as device-resident for the CPU ledger (no-op elsewhere).

        On accelerators the caching allocator already sees every device tensor.
        """
        return

    # ---- distributed -----------------------------------------------------------------
    def init_process_group(
        self,
        rank: int,
        world_size: int,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
        timeout_s: float = 300.0,
        store: dist.Store | None = None,
    ) -> None:
        """Join the default process group with this platform's backend.

        Rendezvous through ``store`` when given (``master_addr`` / ``master_port`` are
        then unused), else through a TCP store rank 0 hosts at ``master_port``. The
        local device (``rank % device_count``) is made current first, as NCCL and HCCL
        require.
        """
        if self.device_count() > 0 and self.torch_device_type != "cpu":
            self.set_device(rank % self.device_count())
        rendezvous = (
            {"store": store}
            if store is not None
            else {"init_method": f"tcp://{master_addr}:{master_port}"}
        )
        dist.init_process_group(
            backend=self.dist_backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **rendezvous,
        )

    def transfer_group(
        self, store: dist.Store, rank: int, size: int, timeout_s: float = 300.0
    ) -> dist.ProcessGroup:
        """A process group beside the default one (its processes may belong to other
        default groups, or none): the trainer ranks send new weights to the rollout
        workers through it. Here gloo over host tensors; a platform with a faster
        device-to-device collective overrides it (and :attr:`transfer_on_device`)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        return dist.ProcessGroupGloo(dist.PrefixStore("weights", store), rank, size, timeout)

    #: Whether :meth:`transfer_group` moves device tensors (else host tensors).
    transfer_on_device: bool = False

    def broadcast(self, group: dist.ProcessGroup, tensor: torch.Tensor, src: int = 0) -> None:
        """``tensor`` of rank ``src`` of ``group`` into every other rank's ``tensor``."""
        options = dist.BroadcastOptions()
        options.rootRank = src
        group.broadcast([tensor], options).wait()

    def use_host_threads(self, devices_per_node: int) -> int:
        """Set this worker's torch intra-op threads for a node of ``devices_per_node``
        devices; the count in use. Accelerator workers keep Ray's (their ``num_cpus``)."""
        return torch.get_num_threads()

    def ray_bundle(
        self, processes: int = 1, cpus_per_worker: float = 1.0, devices: int = 1
    ) -> dict[str, float]:
        """``devices`` devices as a Ray placement-group bundle shared by ``processes``
        worker processes (the roles collocated on it). On CPU a device *is* one CPU slot,
        which its processes share; an accelerator's bundle adds each process's CPU slots."""
        if self.ray_resource == "CPU":
            return {"CPU": float(devices)}
        return {self.ray_resource: float(devices), "CPU": cpus_per_worker * processes}

    def ray_actor_options(self, cpus_per_worker: float = 1.0, device_share: float = 1.0) -> dict:
        """Ray actor options reserving ``device_share`` of one device for a worker (Ray
        then sets the worker's visible-devices variable; processes sharing a bundle see the
        same device). On CPU the device *is* one CPU slot."""
        if self.ray_resource == "CPU":
            return {"num_cpus": device_share}
        return {"num_cpus": cpus_per_worker, "resources": {self.ray_resource: device_share}}

    def empty_cache(self) -> None:
        """Return this process's cached free device memory to the device, so another
        process on it can allocate it (no-op where no caching allocator keeps it)."""
        return

    def visible_devices_for(self, indexes: list[int]) -> dict[str, str]:
        """Environment a worker needs to see only ``indexes`` (empty on CPU)."""
        if self.visible_devices_env is None:
            return {}
        return {self.visible_devices_env: ",".join(str(i) for i in indexes)}

    def __repr__(self) -> str:
        return f"<Device {self.name}: {self.dist_backend}, ray={self.ray_resource}>"
