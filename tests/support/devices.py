"""Device parameters for tests that run on every platform this machine has.

``device_params(ranks=1)`` gives one pytest param per platform: ``cpu`` always runs;
``cuda`` and ``npu`` carry their marker and are skipped with the device layer's own
reason where the hardware is missing; with ``ranks > 1`` an accelerator param is also
marked ``multi_device`` and needs that many devices.
"""

from __future__ import annotations

import pytest

from backends.device.registry import DEVICE_CLASSES

PLATFORMS = ("cpu", "cuda", "npu")


def missing_reason(name: str, ranks: int = 1) -> str | None:
    """Why ``ranks`` devices of platform ``name`` cannot be used here (None: they can)."""
    platform = DEVICE_CLASSES[name]
    reason = platform.unavailable_reason()
    if reason is not None:
        return f"no {name} device here: {reason}"
    count = platform().device_count()
    if name != "cpu" and count < ranks:
        return f"needs {ranks} {name} devices, this machine has {count}"
    return None


def device_params(ranks: int = 1, platforms: tuple[str, ...] = PLATFORMS) -> list:
    params = []
    for name in platforms:
        marks = [] if name == "cpu" else [getattr(pytest.mark, name)]
        if ranks > 1 and name != "cpu":
            marks.append(pytest.mark.multi_device)
        reason = missing_reason(name, ranks)
        if reason is not None:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(name, marks=marks, id=name))
    return params
