"""Device <-> host swap of whole storages into pinned host buffers allocated once.

Swapping works on storages, not tensors: a Megatron parameter or gradient is often a
view into one large contiguous buffer, and releasing that buffer with
``untyped_storage().resize_(0)`` keeps every view (optimizer, DDP, the model) valid;
resizing it back and copying in restores them in place.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from backends.device import Device


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage (valid until the storage is resized)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class HostSwap:
    """Moves storages device -> host and back, reusing one pinned buffer per storage.

    Attributes:
        host_allocations: pinned buffers allocated so far (stays flat after iteration 1).
        swapped_bytes: bytes currently held on the host instead of the device.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.host_allocations = 0
        self.swapped_bytes = 0
        self._host: dict[int, torch.Tensor] = {}  # storage id -> pinned uint8 [nbytes]
        self._out: list[tuple[torch.UntypedStorage, int]] = []

    def _device_storages(self, tensors: Iterable[torch.Tensor]) -> list[torch.UntypedStorage]:
        seen: dict[int, torch.UntypedStorage] = {}
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.device.type == self.device.torch_device_type and storage.nbytes() > 0:
                seen.setdefault(storage._cdata, storage)
        return list(seen.values())

    def _host_buffer(self, storage: torch.UntypedStorage) -> torch.Tensor:
        buffer = self._host.get(storage._cdata)
        if buffer is None or buffer.numel() != storage.nbytes():
            buffer = self.device.pinned_empty((storage.nbytes(),), torch.uint8)
            self._host[storage._cdata] = buffer
            self.host_allocations += 1
        return buffer

    def swap_out(self, tensors: Iterable[torch.Tensor]) -> int:
        """Copy the storages of ``tensors`` to host and release their device memory.

        Returns:
            Bytes moved to the host by this call.
        """
        storages = self._device_storages(tensors)
        self._forget_stale_buffers(storages)
        for storage in storages:
            self._host_buffer(storage).copy_(_byte_view(storage), non_blocking=True)
        self.device.synchronize()  # host copies must be complete before memory is released
        moved = 0
        for storage in storages:
            self._out.append((storage, storage.nbytes()))
            moved += storage.nbytes()
            storage.resize_(0)
        self.swapped_bytes += moved
        return moved

    def _forget_stale_buffers(self, storages: list[torch.UntypedStorage]) -> None:
        # Tensors re-created between swaps (e.g. grads set to None and re-made by the
        # next backward) get new storages; their old pinned buffers would pile up.
        live = {storage._cdata for storage in storages}
        for key in [k for k in self._host if k not in live]:
            del self._host[key]

    def swap_in(self) -> int:
        """Reallocate every swapped storage and copy it back from its pinned buffer.

        Synchronous: the copies are complete when it returns (an overlapped variant on a
        side stream would need a GPU to show it pays; none was measured).

        Returns:
            Bytes restored.
        """
        for storage, nbytes in self._out:
            storage.resize_(nbytes)
            _byte_view(storage).copy_(self._host[storage._cdata], non_blocking=True)
        self.device.synchronize()  # pinned buffers are overwritten by the next swap_out
        restored = sum(nbytes for _, nbytes in self._out)
        self._out, self.swapped_bytes = [], 0
        return restored

    @property
    def host_bytes(self) -> int:
        return sum(buffer.numel() for buffer in self._host.values())
