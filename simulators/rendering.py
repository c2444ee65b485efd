"""Former home of the rendering helpers, now :mod:`mmrl.simulators.common.rendering`; re-exported for old imports."""

from .common.rendering import (
    APT_COMMAND,
    DEBIAN_PACKAGES,
    FIX_HINT,
    VALID_BACKENDS,
    RenderBackendError,
    create_renderer,
    disable_expensive_flags,
    fast_visual_settings,
    select_backend,
)

__all__ = [
    "APT_COMMAND",
    "DEBIAN_PACKAGES",
    "FIX_HINT",
    "VALID_BACKENDS",
    "RenderBackendError",
    "create_renderer",
    "disable_expensive_flags",
    "fast_visual_settings",
    "select_backend",
]
