"""Choosing the device: detection, explicit requests, and the per-process instance."""

from __future__ import annotations

import os

from backends.device.base import Device, DeviceUnavailableError
from backends.device.cpu import CpuDevice
from backends.device.cuda import CudaDevice
from backends.device.npu import NpuDevice

#: Detection order: the first available wins.
DEVICE_CLASSES: dict[str, type[Device]] = {"npu": NpuDevice, "cuda": CudaDevice, "cpu": CpuDevice}
ENV_VAR = "MINDRL_DEVICE"

_current: Device | None = None


def available_devices() -> list[str]:
    """Names of the platforms usable in this process, in detection order."""
    return [name for name, cls in DEVICE_CLASSES.items() if cls.is_available()]


def library_workspace_bytes(name: str) -> int:
    """:attr:`Device.library_workspace_bytes` of platform ``name``, read without a device
    (the planner sizes a cluster's devices from anywhere)."""
    return DEVICE_CLASSES[name].library_workspace_bytes


def resolve_device(requested: str | None = None) -> str:
    """Name of the device to use: ``requested``, else ``$MINDRL_DEVICE``, else detected.

    ``"auto"`` asks for no device in particular, like ``None``: ``$MINDRL_DEVICE`` still
    applies (the CLI's fail-fast check and the run must resolve the same device).

    Raises:
        DeviceUnavailableError: the explicit request is unknown or cannot be met here.
    """
    if requested is not None and requested.strip().lower() == "auto":
        requested = None
    choice = requested or os.environ.get(ENV_VAR) or "auto"
    choice = choice.strip().lower()
    if choice == "auto":
        return available_devices()[0]
    if choice not in DEVICE_CLASSES:
        known = ", ".join(["auto", *DEVICE_CLASSES])
        raise DeviceUnavailableError(f"unknown device '{choice}'; choose one of: {known}")
    reason = DEVICE_CLASSES[choice].unavailable_reason()
    if reason is not None:
        raise DeviceUnavailableError(f"device '{choice}' was requested but {reason}")
    return choice


def get_device(requested: str | None = None) -> Device:
    """The process-wide :class:`Device`, created on first use.

    A later call with a different explicit request replaces it (tests and the CLI use
    this); calls without a request return the current one.
    """
    global _current
    if _current is not None and (requested is None or requested == _current.name):
        return _current
    _current = DEVICE_CLASSES[resolve_device(requested)]()
    return _current


def reset_device() -> None:
    """Forget the process-wide device (for tests that switch platforms)."""
    global _current
    _current = None
