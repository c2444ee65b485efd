"""One-line errors for model weights that are not on this machine.

Every loader (:func:`mmrl.models.tiny_vlm.load_vlm`, :func:`mmrl.policies.causal_lm.load_causal_lm`,
:func:`mmrl.adapters.diffusion.tiny_model.load_diffusion_pipeline`) wraps its ``from_pretrained`` calls in
:func:`model_load_errors`: a missing download, an offline hub, a gated or unknown repo, or a local folder
without weights becomes a :class:`ModelNotAvailableError` (a :class:`~mmrl.errors.ConfigError`, so
``mmrl train`` prints one line and exits with code 2) that names the model id, where it was looked
for and how to fetch it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

from mmrl.errors import ConfigError

__all__ = ["ModelNotAvailableError", "check_model_folder", "hf_cache_dir", "model_load_errors", "model_not_available"]

_TRUE = ("1", "true", "yes", "on")


class ModelNotAvailableError(ConfigError):
    """The weights of a model (hub id or local folder) could not be found or read on this machine."""


def hf_cache_dir() -> str:
    """Where ``from_pretrained`` looks for hub downloads (``HF_HUB_CACHE`` / ``HF_HOME``/hub)."""
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers / diffusers
        home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
        return os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))


def _offline() -> bool:
    if any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover
        return False


def _first_line(exc: BaseException, limit: int = 200) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def model_not_available(source: str | Path, exc: BaseException, *, what: str = "model") -> ModelNotAvailableError:
    """The one-line error for ``source`` (a hub id or a local folder) that failed to load with ``exc``."""
    src = str(source)
    local = Path(src).expanduser()
    if local.exists():
        return ModelNotAvailableError(
            f"{what} folder {local} could not be loaded ({_first_line(exc)}); it must be a complete saved "
            f"Hugging Face {what} (config files and weights, e.g. from `hf download <id> --local-dir {local}`)"
        )
    try:
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover
        GatedRepoError = RepositoryNotFoundError = ()  # type: ignore[assignment]
    chain = [exc, exc.__cause__, exc.__context__]
    if any(type(e).__name__ == "HFValidationError" for e in chain if e is not None):
        return ModelNotAvailableError(
            f"{what} {src!r} is neither an existing folder nor a Hugging Face hub id 'owner/name' "
            f"({_first_line(exc, 120)}); set model.path to a local folder or a hub id"
        )
    if any(isinstance(e, GatedRepoError) for e in chain if e is not None):
        why = "the hub refused access (gated repo: accept its licence and `hf auth login`)"
    elif any(isinstance(e, RepositoryNotFoundError) for e in chain if e is not None):
        why = "the hub has no such repo (check the id, or log in for a private one)"
    elif _offline():
        why = "the hub is switched off (HF_HUB_OFFLINE=1)"
    else:
        why = f"the hub could not provide it ({_first_line(exc, 120)})"
    return ModelNotAvailableError(
        f"{what} {src} is not on this machine: not found in the Hugging Face cache {hf_cache_dir()} and {why}; "
        f"fetch it on a machine with hub access with `hf download {src}` (or `huggingface-cli download {src}`) "
        f"and copy that cache here (set HF_HOME / HF_HUB_CACHE to it), or download it to a folder and pass "
        f"model.path=/local/folder"
    )


def check_model_folder(path: str | Path, marker: str, *, what: str = "model") -> None:
    """An existing local ``path`` must hold ``marker`` (``config.json``, ``model_index.json``); hub ids pass."""
    p = Path(str(path)).expanduser()
    if p.exists() and not (p / marker).is_file():
        raise ModelNotAvailableError(
            f"{what} folder {p} has no {marker}: not a saved Hugging Face {what}; pass model.path=<a folder "
            f"written by save_pretrained or `hf download <id> --local-dir <folder>`> or a hub id"
        )


_HUB_LOGGERS = ("huggingface_hub", "transformers", "diffusers")


class _Hold(logging.Filter):
    """On one handler: keep the hub libraries' records below ERROR instead of emitting them."""

    def __init__(self, handler: logging.Handler, held: list) -> None:
        super().__init__()
        self.handler, self.held = handler, held

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and record.name.split(".")[0] in _HUB_LOGGERS:
            self.held.append((self.handler, record))
            return False
        return True


@contextlib.contextmanager
def _hold_hub_warnings(held: list) -> Iterator[None]:
    """Hold what the hub libraries log (``Couldn't connect to the Hub ... will try the cache``) during a load."""
    filters, seen = [], set()
    for name in ("", *_HUB_LOGGERS):
        for h in logging.getLogger(name).handlers:
            if id(h) not in seen:
                seen.add(id(h))
                f = _Hold(h, held)
                h.addFilter(f)
                filters.append(f)
    try:
        yield
    finally:
        for f in filters:
            f.handler.removeFilter(f)


@contextlib.contextmanager
def model_load_errors(source: str | Path, *, what: str = "model") -> Iterator[None]:
    """Turn the errors ``from_pretrained`` raises for missing weights into :class:`ModelNotAvailableError`.

    The hub libraries' warnings logged during the load are shown only when it succeeds: when it fails,
    the one-line error says it all.
    """
    try:
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover
        HFValidationError = ()  # type: ignore[assignment]
    held: list[tuple[logging.Handler, logging.LogRecord]] = []

    def show_held() -> None:
        for handler, record in held:
            handler.handle(record)

    try:
        with _hold_hub_warnings(held):
            yield
    except (OSError, HFValidationError) as e:  # OSError: EnvironmentError, HTTP errors, missing cache entries
        raise model_not_available(source, e, what=what) from e  # the one line says it all: held records dropped
    except BaseException:
        show_held()
        raise
    show_held()
