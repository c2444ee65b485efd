"""Plugins: code outside the package that adds tasks, model types, estimators or losses to mmrl's registries.

A plugin is a Python module (or a callable in one) that registers what it brings when it runs:
:func:`mmrl.tasks.register_task`, :func:`mmrl.models.registry.register_model_type`,
``mmrl.algos.registry.ADVANTAGE_ESTIMATORS.register`` / ``POLICY_LOSSES.register``, and optionally
:func:`register_config_dir` (a folder of ``task/<name>.yaml`` / ``model/<name>.yaml`` presets, composed like the
packaged ``configs/``). Two routes load them, both before a task or model type is looked up:

* **installed packages**: every entry point of the ``mmrl.plugins`` group (``[project.entry-points."mmrl.plugins"]``
  in the package's pyproject.toml) is loaded once per process; an entry point that names a module is imported, one
  that names a callable is called with no arguments;
* **the run config**: ``plugins=[my_pkg.audio, path/to/file.py, path/to/my_pkg]`` (:attr:`mmrl.config.RunConfig.plugins`)
  names modules to import, or files / package folders to import as modules (their parent folder goes on
  ``sys.path``, as ``python file.py`` does). A run folder's config.yaml keeps the list (paths made absolute), so
  ``mmrl eval checkpoint=<run>`` imports them again.

A plugin named in the config that cannot be loaded is a one-line :class:`~mmrl.errors.ConfigError`; an installed
entry point that fails is a one-line warning (a broken unrelated package must not stop every run), and the names
that failed are listed in the "unknown task" / "unknown model.type" errors (:func:`failed_entry_points`).
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

from mmrl.errors import ConfigError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mmrl.plugins"
"""The entry-point group an installed plugin package declares itself in."""

_loaded: dict[str, str] = {}  # plugin spec as given -> the module it loaded
_entry_points_done = False
_failed: dict[str, str] = {}  # entry point name -> one-line reason
_config_dirs: list[Path] = []


def load_entry_points() -> list[str]:
    """Load every installed ``mmrl.plugins`` entry point (once per process); returns the names loaded now."""
    global _entry_points_done
    if _entry_points_done:
        return []
    _entry_points_done = True
    from importlib.metadata import entry_points

    done = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type(sys)):
                obj()
        except Exception as e:  # noqa: BLE001 - a broken installed plugin: one line, the run goes on without it
            reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            _failed[ep.name] = f"{ep.value} ({reason})"
            log.warning("mmrl plugin %s = %s could not be loaded: %s", ep.name, ep.value, reason)
            continue
        done.append(ep.name)
    return done


def failed_entry_points() -> dict[str, str]:
    """``{entry point name: "value (reason)"}`` of the installed plugins that failed to load in this process."""
    return dict(_failed)


def failed_hint() -> str:
    """``"; plugins that failed to load: name = value (reason), ..."`` for an "unknown task / model type" error, or
    ``""`` when every installed plugin loaded."""
    if not _failed:
        return ""
    return "; plugins that failed to load: " + ", ".join(f"{k} = {v}" for k, v in _failed.items())


def _is_path(spec: str) -> bool:
    """A ``plugins=`` entry that names a file or folder rather than a module."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _split_spec(spec: str) -> tuple[str, str, str]:
    """``(target, ":", attr)`` of a ``module:attr`` / ``path:attr`` entry, ``(spec, "", "")`` without a callable (a
    ``.py`` file names none)."""
    return spec.rpartition(":") if ":" in spec and not spec.endswith(".py") else (spec, "", "")


def _import_file(path: Path) -> str:
    """Import ``path`` (a ``.py`` file or a package folder) as the module named after it, with its parent folder
    first on ``sys.path``."""
    name = path.stem if path.is_file() else path.name
    if not name.isidentifier():
        raise ConfigError(f"plugins: {path}: the name must be a Python module name")
    have = sys.modules.get(name)
    if have is not None:
        where = Path(getattr(have, "__file__", "") or "").resolve()
        if where in (path, path / "__init__.py"):
            return name
        raise ConfigError(
            f"plugins: {path}: a module named {name!r} is already imported from {where} (an installed copy of this "
            f"plugin?); name the module instead (plugins=[{name}]) or rename the file"
        )
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.import_module(name)
    return name


def load_plugin(spec: str) -> str:
    """Import one plugin of ``plugins=[...]``: a module name (``my_pkg.audio``) or a ``.py`` file; a ``module:attr``
    names a callable to call after the import. Returns the module name; ConfigError (one line) when it fails.
    Each spec is loaded once per process."""
    if spec in _loaded:
        return _loaded[spec]
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"plugins: each entry is a module name or a .py file, got {spec!r}")
    target, _, attr = _split_spec(spec)
    try:
        if _is_path(target):
            path = Path(target).expanduser().resolve()
            if not (path.is_file() and path.suffix == ".py") and not (path / "__init__.py").is_file():
                raise ConfigError(f"plugins: {spec}: no such .py file or package folder")
            module = _import_file(path)
        else:
            module = importlib.import_module(target).__name__
        if attr:
            fn = getattr(sys.modules[module], attr, None)
            if not callable(fn):
                raise ConfigError(f"plugins: {spec}: {module} has no callable {attr!r}")
            fn()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the plugin's own import error: one line naming it
        raise ConfigError(f"plugins: {spec} could not be loaded ({type(e).__name__}: {e})") from None
    _loaded[spec] = module
    return module


def load_plugins(specs: list[str] | tuple[str, ...] | None = None) -> None:
    """The installed entry points (once), then each of ``specs`` (``plugins=[...]``), in order."""
    load_entry_points()
    if specs is None:
        return
    if isinstance(specs, str) or not isinstance(specs, (list, tuple)):
        raise ConfigError(
            f"plugins must be a list of module names or .py files, e.g. plugins=[my_pkg.audio]; got {specs!r}"
        )
    for spec in specs:
        load_plugin(spec)


def plugin_path(spec: str) -> str:
    """A ``plugins=`` entry as a run folder records it: a file or folder made absolute (``mmrl eval`` may run from
    another folder), a module name unchanged."""
    if isinstance(spec, str) and _is_path(spec):
        target, colon, attr = _split_spec(spec)
        return str(Path(target).expanduser().resolve()) + colon + attr
    return spec


def register_config_dir(path: str | Path) -> None:
    """Add a folder of config presets (``task/<name>.yaml``, ``model/<name>.yaml``, ... laid out like mmrl's
    ``configs/``) to what ``task=`` / ``model=`` can select. A task preset there composes as a packaged one does:
    ``# @package _global_`` with ``defaults: [{override /model: <its model preset>}]``."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"register_config_dir: {folder} is not a folder")
    if folder not in _config_dirs:
        _config_dirs.append(folder)


def config_dirs() -> list[Path]:
    """The plugins' config folders, in registration order."""
    return list(_config_dirs)
