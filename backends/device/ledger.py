"""Memory ledger: "device memory" statistics for the CPU device.

On CPU the device *is* host memory, so the process RSS says nothing about what mindrl
would hold on an accelerator. Instead mindrl declares the tensors that would live on a
device (training weights, grads, optimizer state, generation shards, temporary gather
buffers) with :meth:`MemoryLedger.track`. ``allocated`` is the sum of the current byte
sizes of their distinct storages, so ``storage().resize_(0)`` and garbage collection are
both seen. The peak is sampled whenever the ledger is read or a tensor is tracked, which
is at every step boundary of the resharder and engines; it cannot see a transient that
comes and goes between two samples.
"""

from __future__ import annotations

import threading
import weakref

import torch


class MemoryLedger:
    """Weakly tracks device-resident tensors and reports their storage bytes."""

    def __init__(self) -> None:
        self._tensors: list[weakref.ref[torch.Tensor]] = []
        self._peak = 0
        self._lock = threading.Lock()

    def track(self, *tensors: torch.Tensor) -> None:
        with self._lock:
            self._tensors.extend(weakref.ref(t) for t in tensors)
        self.allocated()

    def allocated(self) -> int:
        """Bytes held now by the distinct storages of all live tracked tensors."""
        with self._lock:
            live = [t for t in (r() for r in self._tensors) if t is not None]
            self._tensors = [weakref.ref(t) for t in live]
            storages: dict[int, int] = {}
            for t in live:
                storage = t.untyped_storage()
                if storage.nbytes() > 0:
                    storages[storage.data_ptr()] = storage.nbytes()
            total = sum(storages.values())
            self._peak = max(self._peak, total)
            return total

    def live_tensors(self) -> list[torch.Tensor]:
        """The tracked tensors still alive."""
        with self._lock:
            return [t for t in (r() for r in self._tensors) if t is not None]

    def peak(self) -> int:
        self.allocated()
        return self._peak

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = 0
        self.allocated()

    def clear(self) -> None:
        with self._lock:
            self._tensors.clear()
            self._peak = 0
