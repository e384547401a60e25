"""Device memory recorded at every resharding step, read through the device layer."""

from __future__ import annotations

from backends.device import Device


class MemoryTimeline:
    """A list of ``(step name, device bytes allocated)`` plus the peak seen meanwhile.

    On accelerators the figures are the caching allocator's; on the CPU they come from
    the device layer's ledger of tracked tensors.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.steps: list[tuple[str, int]] = []

    def record(self, step: str) -> int:
        """Append the current allocation under ``step`` and return it."""
        self.device.synchronize()
        allocated = self.device.memory_allocated()
        self.steps.append((step, allocated))
        return allocated

    def bytes_at(self, step: str) -> int:
        """Bytes recorded at the last step named ``step``."""
        for name, allocated in reversed(self.steps):
            if name == step:
                return allocated
        raise KeyError(f"no step '{step}' in the timeline; recorded: {[s for s, _ in self.steps]}")

    def peak(self) -> int:
        return max((allocated for _, allocated in self.steps), default=0)

    def clear(self) -> None:
        self.steps.clear()
