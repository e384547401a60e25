"""Bottom layer of mindrl: the device layer and the engines.

Only this package may name a device (``torch.cuda``, ``torch_npu``, NCCL/HCCL, the
visible-devices variables, Ray's GPU/NPU resources). It never imports ``mindrl`` or
``trainers``.
"""

from backends.device import (
    Device,
    DeviceUnavailableError,
    available_devices,
    get_device,
    resolve_device,
)

__all__ = [
    "Device",
    "DeviceUnavailableError",
    "available_devices",
    "get_device",
    "resolve_device",
]
