"""Device layer: one interface (:class:`Device`), one module per platform, a registry.

Detection order is npu (``torch_npu`` imports), then cuda, then cpu. An explicit choice
(``--device``, config ``device:``, or ``MINDRL_DEVICE``) that cannot be met raises
:class:`DeviceUnavailableError` with one line saying why and how to fix it.

Example:
    >>> from backends.device import get_device
    >>> dev = get_device()            # detected, cached per process
    >>> dev.dist_backend, dev.ray_resource
    ('gloo', 'CPU')
"""

from backends.device.base import Device, DeviceUnavailableError
from backends.device.registry import (
    available_devices,
    get_device,
    library_workspace_bytes,
    resolve_device,
)

__all__ = [
    "Device",
    "DeviceUnavailableError",
    "available_devices",
    "get_device",
    "library_workspace_bytes",
    "resolve_device",
]
