"""Offscreen rendering helpers shared by the simulators.

MuJoCo chooses its OpenGL backend once, from the ``MUJOCO_GL`` environment variable, the
first time ``mujoco`` is imported.  These helpers validate a requested backend, set the
variable when that is still possible, turn low-level GL failures into one
:class:`RenderBackendError` that names the fix, and switch off the expensive render
features (shadows, reflections, skybox, multisampling) that dominate the cost of small
images on a software rasteriser.
"""

from __future__ import annotations

import os
import sys
from typing import Any

VALID_BACKENDS: tuple[str, ...] = ("egl", "osmesa", "glfw")
DEBIAN_PACKAGES: tuple[str, ...] = ("libegl1", "libgl1", "libglx-mesa0", "libegl-mesa0", "libosmesa6")
APT_COMMAND = "apt-get install -y --no-install-recommends " + " ".join(DEBIAN_PACKAGES)
FIX_HINT = (
    "Set MUJOCO_GL=egl (or MUJOCO_GL=osmesa for pure-CPU Mesa) in the environment before "
    f"Python imports mujoco, and install the Debian packages: `{APT_COMMAND}`."
)


class RenderBackendError(RuntimeError):
    """The offscreen render backend is invalid, unavailable or failed to start."""


def _active_mujoco_backend() -> str | None:
    """The backend mujoco fixed at import time, or None when mujoco is not imported yet."""
    if "mujoco" not in sys.modules:
        return None
    try:
        from mujoco.rendering.classic import gl_context  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - very old mujoco layout
        return os.environ.get("MUJOCO_GL", "").lower().strip()
    return getattr(gl_context, "_MUJOCO_GL", os.environ.get("MUJOCO_GL", "")).lower().strip()


def select_backend(backend: str | None = None) -> str:
    """Validate ``backend`` (or ``$MUJOCO_GL`` when None) and return the backend name in use.

    When mujoco has not been imported yet the choice is written to ``MUJOCO_GL`` (default
    ``egl``).  Raises :class:`RenderBackendError` for an unknown name, or when mujoco was
    already imported with a different backend (it cannot be switched inside a process).
    """
    requested = (backend if backend is not None else os.environ.get("MUJOCO_GL", "")).lower().strip()
    if backend is not None and requested not in VALID_BACKENDS:
        raise RenderBackendError(f"render backend {backend!r} is not one of {VALID_BACKENDS}. {FIX_HINT}")
    if requested in ("disable", "disabled", "off", "false", "0"):
        raise RenderBackendError(f"MUJOCO_GL={requested!r} disables rendering, but images were requested. {FIX_HINT}")
    active = _active_mujoco_backend()
    if active is None:
        chosen = requested or "egl"
        if chosen not in VALID_BACKENDS:
            raise RenderBackendError(f"MUJOCO_GL={chosen!r} is not one of {VALID_BACKENDS}. {FIX_HINT}")
        os.environ["MUJOCO_GL"] = chosen
        return chosen
    if backend is not None and active != requested:
        raise RenderBackendError(
            f"render backend {backend!r} requested, but mujoco was already imported with "
            f"MUJOCO_GL={active or 'glfw'!r}; the backend is fixed per process. {FIX_HINT}"
        )
    return active or "glfw"


def create_renderer(model: Any, height: int, width: int, backend: str | None = None) -> Any:
    """Build a ``mujoco.Renderer`` for ``model`` with fast scene flags.

    Any failure of the GL stack (missing library, no EGL device, bad display) is re-raised
    as :class:`RenderBackendError` with the fix in the message.
    """
    chosen = select_backend(backend)
    try:
        import mujoco

        renderer = mujoco.Renderer(model, height=height, width=width)
    except RenderBackendError:
        raise
    except ValueError:
        raise  # image larger than the model's offscreen buffer: a caller bug, keep mujoco's message
    except Exception as exc:  # noqa: BLE001 - GL stacks raise many unrelated types
        raise RenderBackendError(
            f"could not start the offscreen renderer with MUJOCO_GL={chosen!r}: {type(exc).__name__}: {exc}. {FIX_HINT}"
        ) from exc
    disable_expensive_flags(renderer.scene)
    return renderer


def disable_expensive_flags(scene: Any) -> None:
    """Turn off shadows, reflections and skybox on an ``MjvScene`` (in place)."""
    import mujoco

    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        scene.flags[flag] = 0


def fast_visual_settings(model: Any) -> None:
    """Disable multisampling and shadow maps on an ``MjModel`` (in place).

    Must run before the render context for ``model`` is created to affect the framebuffer.
    """
    model.vis.quality.offsamples = 0
    model.vis.quality.shadowsize = 0
    model.light_castshadow[:] = 0
