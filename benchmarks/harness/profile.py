"""Where a step's time goes: ``torch.profiler``'s most expensive operators, per step.

On a device whose kernels the profiler sees (``Device.profiler_activities``: CUDA) the
table ranks operators by their kernels' self time on the device, and ``busy_ms_per_step``
is the device's busy time: far below the step's wall time, the step waits on the host
(kernel launches, synchronisations, host-side packing). Elsewhere it ranks by host time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Characters of an operator's name kept in the table.
NAME_CHARS = 120


def profile_steps(step: Callable[[], None], steps: int, device: Any, top: int = 15) -> dict:
    """Run ``step`` ``steps`` times under the profiler; the ``top`` operators by self
    time, each with its milliseconds and calls per step and its share of the total."""
    from torch.profiler import profile

    activities = device.profiler_activities()
    on_device = len(activities) > 1
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        device.synchronize()

    def self_us(event: Any) -> float:
        return event.self_device_time_total if on_device else event.self_cpu_time_total

    events = [e for e in prof.key_averages() if self_us(e) > 0]
    total = sum(self_us(e) for e in events) or 1.0
    ranked = sorted(events, key=self_us, reverse=True)[:top]
    return {
        "timed_on": "device" if on_device else "host",
        "busy_ms_per_step": round(total / 1e3 / steps, 3),
        "top": [
            {
                "name": e.key[:NAME_CHARS],
                "ms_per_step": round(self_us(e) / 1e3 / steps, 3),
                "calls_per_step": e.count / steps,
                "share": round(self_us(e) / total, 4),
            }
            for e in ranked
        ],
    }
