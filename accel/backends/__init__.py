"""Hardware backends: the only package that touches device modules. See `base.Backend`."""

from .base import (
    Availability,
    Backend,
    BackendError,
    BackendUnavailableError,
    Capability,
    DeviceProperties,
    Timer,
    UnsupportedFeatureError,
    torch_version,
)
from .device_module import DeviceModuleBackend
from .host import HOST_DEVICE_TYPE, is_host_device
from .registry import (
    ENTRY_POINT_GROUP,
    OVERRIDE_ENV,
    BackendRegistry,
    UnknownBackendError,
    available_backends,
    get_backend,
    get_registry,
    register_backend,
    reset_registry,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "HOST_DEVICE_TYPE",
    "OVERRIDE_ENV",
    "Availability",
    "Backend",
    "BackendError",
    "BackendRegistry",
    "BackendUnavailableError",
    "Capability",
    "DeviceModuleBackend",
    "DeviceProperties",
    "Timer",
    "UnknownBackendError",
    "UnsupportedFeatureError",
    "available_backends",
    "get_backend",
    "get_registry",
    "is_host_device",
    "register_backend",
    "reset_registry",
    "torch_version",
]
