"""Run folders: where a run writes, what it may delete, and the record of every start.

A run folder is ``<trainer.output_dir>/<trainer.run_name>``. The name is a relative path below the output folder
(``a/b`` is fine); an absolute path, a ``..`` component, an empty or over-long name, or a name the filesystem cannot
hold is a :class:`~mmrl.errors.ConfigError` before anything is built or written.

mmrl marks every run folder it creates with :data:`RUN_MARKER`; ``trainer.checkpointing.overwrite=true`` deletes a folder only when
it carries that marker, so a crafted or mistaken name can never delete the output folder, the working directory or
anything mmrl did not create.

Every start of a run (the first and each resume) leaves its resolved config in ``config_history/`` (see
:func:`record_start`); ``config.yaml`` is the config of the latest start, the one its newest checkpoint was trained
with (``mmrl eval`` reads it).

A process that trains in a run folder owns it: :class:`RunLock` (the file :data:`LOCK_FILE`) keeps a second command
from deleting, resuming or writing the same run while the first trains, and survives ``kill -9``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from mmrl.errors import ConfigError

log = logging.getLogger(__name__)

RUN_MARKER = ".mmrl_run"
"""Written into every run folder mmrl creates; ``trainer.checkpointing.overwrite=true`` deletes only folders that have it."""
MAX_NAME_CHARS = 200
"""Longest run name accepted (whole relative path); each component must also fit the filesystem's NAME_MAX."""
HISTORY_DIR = "config_history"
LOCK_FILE = ".mmrl_lock"
"""The run lock's file in a run folder (see :class:`RunLock`); present only while a process owns the folder, or
after that process was killed (a stale lock, taken over by the next command)."""


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the filesystem of ``folder`` (or its nearest existing parent) holds."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_run_name(name: str, output_dir: str | Path) -> None:
    """ConfigError (one line) unless ``name`` is a relative folder name that stays below ``output_dir``."""
    shown = name if len(name) <= 60 else name[:57] + "..."
    if not name or not name.strip():
        raise ConfigError(
            "trainer.run_name is empty; give a folder name below trainer.output_dir (or leave it unset "
            "for '<task>-<timestamp>')"
        )
    if "\x00" in name or any(ord(c) < 32 for c in name):
        raise ConfigError(
            f"trainer.run_name={shown!r} holds control characters; use letters, digits, '-', '_', '.', '/'"
        )
    if os.path.isabs(name) or name.startswith("~"):
        raise ConfigError(
            f"trainer.run_name={shown} is an absolute path; a run name is a folder below "
            f"trainer.output_dir={output_dir} (to write elsewhere set trainer.output_dir)"
        )
    parts = Path(name).parts
    if ".." in parts:
        raise ConfigError(
            f"trainer.run_name={shown} has a '..' component: a run folder stays inside "
            f"trainer.output_dir={output_dir} (to write elsewhere set trainer.output_dir)"
        )
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(f"trainer.run_name is {len(name)} characters long (at most {MAX_NAME_CHARS}): {shown}")
    limit = _name_max(Path(output_dir))
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > limit:
            raise ConfigError(
                f"trainer.run_name: the component {part[:40]!r}... is longer than this filesystem's "
                f"{limit}-byte file-name limit"
            )
    if all(p in (".", "") for p in parts):
        raise ConfigError(f"trainer.run_name={shown!r} names the output folder itself; give a folder name below it")


def run_dir_path(output_dir: str | Path, name: str) -> Path:
    """``output_dir / name`` after :func:`check_run_name`, refusing a path that resolves outside ``output_dir``
    (e.g. through a symbolic link)."""
    check_run_name(name, output_dir)
    out = Path(output_dir)
    run_dir = out / name
    root, target = out.resolve(), run_dir.resolve()
    if target == root or root not in target.parents:
        raise ConfigError(
            f"trainer.run_name={name} resolves to {target}, outside trainer.output_dir={root} "
            "(a symbolic link?); choose another name"
        )
    return run_dir


def check_writable(folder: str | Path, what: str = "trainer.output_dir") -> None:
    """Create ``folder`` if needed and write a probe file in it; ConfigError naming it when that fails."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".mmrl-write-probe-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"{what}={folder} is not writable ({e.strerror or type(e).__name__}); choose a folder you can "
            f"write to with {what}=PATH"
        ) from None


def is_mmrl_run(run_dir: Path) -> bool:
    """True when ``run_dir`` was created by mmrl (it holds :data:`RUN_MARKER`)."""
    return (Path(run_dir) / RUN_MARKER).is_file()


def create_run_dir(run_dir: Path) -> None:
    """Make ``run_dir`` and mark it as mmrl's (idempotent); ConfigError when it cannot be written (a full disk)."""
    marker = run_dir / RUN_MARKER
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            marker.write_text("created by mmrl; trainer.checkpointing.overwrite=true may delete this folder\n")
    except OSError as e:
        raise _unwritable(run_dir, e) from None


def _unwritable(run_dir: Path, error: OSError) -> ConfigError:
    return ConfigError(
        f"cannot write the run folder {run_dir} ({error.strerror or type(error).__name__}); free some space or "
        "choose another trainer.output_dir"
    )


def refuse_unless_mmrl_run(run_dir: Path) -> None:
    """ConfigError unless ``run_dir`` is a run folder mmrl created (what ``trainer.checkpointing.overwrite=true`` may delete)."""
    if not is_mmrl_run(run_dir):
        raise ConfigError(
            f"trainer.checkpointing.overwrite=true: {run_dir} was not created by mmrl (no {RUN_MARKER} marker); "
            "mmrl deletes only its own run folders. Remove it yourself or choose another trainer.run_name"
        )


def clear_run_dir(run_dir: Path, *, keep: tuple[str, ...] = ()) -> None:
    """``trainer.checkpointing.overwrite=true``: delete a run folder mmrl created (but the top-level entries named in ``keep``: the
    lock of the process that clears it); ConfigError for any other folder."""
    refuse_unless_mmrl_run(run_dir)
    if not keep:
        shutil.rmtree(run_dir)
        return
    for entry in run_dir.iterdir():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


# ---------------------------------------------------------------- the run lock: one process owns a run folder


class RunLocked(ConfigError):
    """Another live process owns the run folder (see :class:`RunLock`); one line naming it."""


_HELD: dict[str, list] = {}
"""Locks this process holds: lock file path -> ``[file descriptor, number of holders]``. A POSIX lock belongs to a
process and closing any descriptor of the file drops it, so each lock file is opened once per process and shared."""

if hasattr(os, "register_at_fork"):  # a forked child (an env worker) holds none of its parent's locks
    os.register_at_fork(after_in_child=_HELD.clear)


def _describe_holder(info: dict) -> str:
    return f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started {info.get('started', '?')}" + (
        f": {info['command']}" if info.get("command") else ""
    )


def _read_lock_info(fd: int) -> dict:
    """The holder recorded in an open lock file ({} when empty or unreadable: a lock being written or torn)."""
    try:
        raw = os.pread(fd, 65536, 0)
        info = json.loads(raw.decode("utf-8", "replace")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _pid_alive(pid) -> bool:
    """True when ``pid`` is a live process on this host."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OSError, ValueError, TypeError, OverflowError):
        return False
    return True


def _try_lock(fd: int) -> bool | None:
    """Take the POSIX write lock of ``fd`` without waiting: True (taken), False (another process holds it), None (this
    filesystem has no locks: the caller falls back to the recorded pid)."""
    import fcntl

    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return False
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise


class RunLock:
    """Ownership of a run folder (or the rescue folder) by the process that trains in it.

    The file :data:`LOCK_FILE` in the folder carries a POSIX lock (``fcntl.lockf``) of the owning process and records
    its pid, host, start time and command line. The kernel drops the lock when that process ends, however it ends
    (``kill -9`` included), so a live run is always refused and a killed one never blocks: the next command finds a
    stale lock (the file without a lock on it), names its dead owner in a warning and takes it over. On a filesystem
    without locks the recorded pid decides (a live pid on this host, or any pid on another host, holds the folder).

    Only the main process of a launch takes it (the other ranks write no run files of their own). The lock belongs to
    the process: a second ``Trainer`` of the same Python process shares it, and it is released when the last of them
    calls :meth:`release` (the end of ``fit``). Reading a run (``mmrl eval``) takes no lock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.released = False

    @classmethod
    def acquire(cls, folder: Path, *, what: str = "run folder") -> RunLock:
        """Own ``folder`` (created if needed); :class:`RunLocked` (one line naming the owner) when a live process owns
        it, ConfigError when the lock cannot be written."""
        folder = Path(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the {what} {folder} ({e.strerror or type(e).__name__})") from None
        path = folder / LOCK_FILE
        key = os.path.realpath(path)
        if key in _HELD:
            _HELD[key][1] += 1
            return cls(path)
        for _ in range(10):  # another process may remove the file between our open and our lock: open it again
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as e:
                raise ConfigError(
                    f"cannot write the lock {path} of the {what} ({e.strerror or type(e).__name__})"
                ) from None
            try:
                if cls._take(fd, path, folder, what):
                    _HELD[key] = [fd, 1]
                    return cls(path)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise RunLocked(f"the {what} {folder} changed owner while mmrl tried to take it; try again")

    @staticmethod
    def _take(fd: int, path: Path, folder: Path, what: str) -> bool:
        """Lock ``fd`` and write this process into it; False when the file was replaced meanwhile (retry)."""
        here = socket.gethostname()
        locked = _try_lock(fd)
        previous = _read_lock_info(fd)
        if locked is False or (
            locked is None
            and previous
            and previous.get("pid") != os.getpid()
            and (previous.get("host") != here or _pid_alive(previous.get("pid")))
        ):
            raise RunLocked(
                f"the {what} {folder} is in use by another mmrl process ({_describe_holder(previous)}); "
                "wait for it to end or stop it, or choose another trainer.run_name"
                + (
                    ""
                    if locked is False
                    else f" (this filesystem has no locks: if that process is gone, delete {path})"
                )
            )
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            return False
        if locked is None:
            log.warning("%s has no file locks; the run lock %s relies on the recorded pid", folder, path)
        if previous and previous.get("pid") != os.getpid():
            gone = previous.get("host") == here and not _pid_alive(previous.get("pid"))
            log.warning(
                "taking over the stale lock of the %s %s: its owner (%s) %s",
                what,
                folder,
                _describe_holder(previous),
                "is gone (killed?) and left it behind" if gone else "no longer holds it",
            )
        info = {
            "pid": os.getpid(),
            "host": here,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)[:500],
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError as e:
            try:  # ours now: leave no empty lock behind (a full disk)
                os.unlink(path)
            except OSError:
                pass
            raise ConfigError(
                f"cannot write the {what} {folder}: its lock {LOCK_FILE} cannot be written "
                f"({e.strerror or type(e).__name__}); free some space or choose another trainer.output_dir"
            ) from None
        return True

    def release(self) -> None:
        """Give the folder up (idempotent): the last holder of this process removes the lock file, then unlocks."""
        if self.released:
            return
        self.released = True
        key = os.path.realpath(self.path)
        held = _HELD.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _HELD[key]
        try:
            os.unlink(self.path)
        except OSError:
            pass  # the folder is gone (deleted by its owner) or unwritable: the lock still ends with the descriptor
        os.close(held[0])


def record_start(run_dir: Path, config_yaml: str, step: int) -> Path:
    """Keep the config of this start: ``config_history/start-NNN-step_SSSSSS.yaml`` (never overwritten) and
    ``config.yaml`` (the latest start's), and what it ran on (:func:`mmrl.versions.environment`: library versions,
    the mmrl commit) as ``start-NNN-step_SSSSSS.environment.json`` beside it and ``environment.json``. Returns the
    history file. ``config.yaml`` and ``environment.json`` are replaced whole (written beside, then renamed): a full
    disk leaves the previous ones, and is a ConfigError naming the folder."""
    from mmrl.versions import environment

    hist = run_dir / HISTORY_DIR
    try:
        hist.mkdir(exist_ok=True)
        n = 1 + sum(1 for p in hist.glob("start-*.yaml"))
        path = hist / f"start-{n:03d}-step_{step:06d}.yaml"
        env = json.dumps(environment(), indent=1) + "\n"
        for target, text in (
            (path, config_yaml),
            (path.with_suffix(".environment.json"), env),
            (run_dir / "config.yaml", config_yaml),
            (run_dir / "environment.json", env),
        ):
            replace_text(target, text)
    except OSError as e:
        raise _unwritable(run_dir, e) from None
    return path


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a temporary file beside it, renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def rescue_dir(run_name: str) -> Path:
    """Where a checkpoint goes when the run folder cannot be written: ``$MMRL_RESCUE_DIR`` or the system temporary
    folder, under ``mmrl-rescue/<run name>`` (locked while written: :func:`mmrl.training_checkpoint.save_to_rescue`)."""
    base = Path(os.environ.get("MMRL_RESCUE_DIR") or tempfile.gettempdir()) / "mmrl-rescue"
    return base / run_name.replace("/", "__")


# ---------------------------------------------------------------- what changed between two starts

HARMLESS_TRAINER_KEYS = frozenset(
    {
        "max_steps",
        "output_dir",
        "run_name",
        "threads",
        "device",
        "strategy",
        "eval",
        "checkpointing",
        "logging",
        "limits",
        "warm_start",
        "fsdp.reshard_after_forward",
        "fsdp.offload",
    }
)
"""Trainer keys a resume may change freely (logged): length, cadence, logging, failure limits, hardware layout; a
section's name covers all its keys (``eval``: every ``trainer.eval.*``). The warm-start keys are here because a
resumed run never redoes its warm start."""


def _flatten(d, prefix: str = "") -> dict:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def is_harmless_change(key: str) -> bool:
    """True for a config key whose change keeps a resumed run the same experiment (see :data:`HARMLESS_TRAINER_KEYS`;
    plus every ``task.eval*`` key and the top-level initial ``checkpoint``, which a resume does not use)."""
    group, _, field = key.partition(".")
    if group == "trainer":
        return field in HARMLESS_TRAINER_KEYS or field.split(".")[0] in HARMLESS_TRAINER_KEYS
    if group == "task":
        return field.startswith("eval")
    return key == "checkpoint"


def config_changes(saved: dict, new: dict, defaults: dict | None = None) -> tuple[dict, dict]:
    """``(significant, harmless)``: ``{key: (saved value, new value)}`` for every dotted key that differs between two
    config dicts (as :func:`mmrl.config.to_dict` writes them); significant changes make it another experiment.
    ``defaults`` (:func:`mmrl.config.field_defaults`): a key the saved config lacks (a field added by a newer mmrl
    than the one that wrote it) set to its default is no change, so upgrading mmrl does not block a resume."""
    a, b = _flatten(saved), _flatten(new)
    d = _flatten(defaults or {})
    significant, harmless = {}, {}
    for key in sorted(set(a) | set(b)):
        old, cur = a.get(key, "<unset>"), b.get(key, "<unset>")
        if key not in a and key in d and _same_value(cur, d[key]):
            continue
        if isinstance(old, tuple):
            old = list(old)
        if isinstance(cur, tuple):
            cur = list(cur)
        if old != cur:
            (harmless if is_harmless_change(key) else significant)[key] = (old, cur)
    return significant, harmless


def _same_value(a, b) -> bool:
    """Equal config values, lists and tuples alike (YAML reads a tuple back as a list)."""
    return (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b)


def describe_changes(changes: dict, limit: int = 6) -> str:
    """``key: old -> new, ...`` (at most ``limit``, then a count) for one-line messages."""
    items = [f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in list(changes.items())[:limit]]
    if len(changes) > limit:
        items.append(f"and {len(changes) - limit} more")
    return ", ".join(items)


def check_same_experiment(
    run_dir: Path, new: dict, *, accept: bool, log_changes: bool = True, defaults: dict | None = None
) -> None:
    """Compare a resume's config (``new``, as :func:`mmrl.config.to_dict` gives it) with the run's ``config.yaml``
    before any weight is loaded: keys that make it another experiment are a ConfigError listing them unless
    ``accept`` (``trainer.checkpointing.resume_accept_changes=true``: logged as a warning); harmless changes are logged."""
    import yaml

    from mmrl.config.deprecated import nest_deprecated_keys

    path = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(
            f"cannot resume {run_dir}: its config.yaml is unreadable or damaged ({type(e).__name__}); "
            "mmrl compares it with the new config before loading weights"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(f"cannot resume {run_dir}: {path} is not a run config written by mmrl")
    nest_deprecated_keys(saved)  # a run folder of an earlier release: its flat trainer keys compare by their new names
    significant, harmless = config_changes(saved, new, defaults)
    if harmless and log_changes:
        log.info("resuming %s with changed settings: %s", run_dir, describe_changes(harmless, limit=20))
    if not significant:
        return
    if not accept:
        raise ConfigError(
            f"cannot resume {run_dir}: the config differs from the run's in keys that make it another "
            f"experiment ({describe_changes(significant)}); undo them, start a new run "
            "(another trainer.run_name), or pass trainer.checkpointing.resume_accept_changes=true to continue anyway"
        )
    if log_changes:
        log.warning(
            "resuming %s with trainer.checkpointing.resume_accept_changes=true despite: %s",
            run_dir,
            describe_changes(significant, limit=20),
        )


def auto_resume_checkpoint(run_dir: Path, *, warn: bool = True) -> Path | None:
    """``trainer.checkpointing.resume=auto``: the newest complete checkpoint of ``run_dir`` that is not damaged (a damaged newest one
    is skipped for the previous one, with a warning naming both); None when there is none. When every checkpoint is
    damaged, :class:`~mmrl.checkpoint_files.DamagedCheckpointError`: training over them would prune them."""
    from mmrl.checkpoint_files import DamagedCheckpointError, latest_loadable_checkpoint

    found, skipped = latest_loadable_checkpoint(run_dir)
    if found is None and skipped:
        raise DamagedCheckpointError(
            skipped[0][0],
            f"{skipped[0][1]}; every checkpoint of {run_dir} is damaged, "
            "none can be continued (move the run folder away to start over)",
        )
    if warn:
        for path, why in skipped:
            log.warning(
                "trainer.checkpointing.resume=auto: skipping damaged checkpoint %s (%s); %s",
                path,
                why,
                f"continuing from {found}" if found is not None else "no earlier complete checkpoint",
            )
        if found is None:
            log.warning(
                "trainer.checkpointing.resume=auto: run directory %s has no complete checkpoint to continue; "
                "training from step 0 in it",
                run_dir,
            )
    return found


# ---------------------------------------------------------------- which folder a run writes, and what it resumes


def open_run(
    trainer_cfg, config: dict, task_name: str, *, is_main: bool, defaults: dict | None = None
) -> tuple[Path, str, Path | None, RunLock | None]:
    """Decide a run's folder and the checkpoint it continues, and own the folder: ``(run_dir, run name, checkpoint or
    None, the run's lock on the main process)``.

    ``trainer.checkpointing.resume``: a checkpoint or run folder (continued), ``auto`` (continue ``trainer.run_name``'s run if it
    exists) or ``never``. An existing run without ``resume`` is refused unless ``trainer.checkpointing.overwrite=true``, which
    clears it only when mmrl created it. A resume is refused when ``config`` (the new run's, as a dict) changes the
    experiment (:func:`check_same_experiment`), before any weight loads. The main process takes the folder's
    :class:`RunLock` before anything is deleted (a live run is refused in one line); nothing else is written here,
    and the lock is released when this raises."""
    from mmrl.checkpoint_files import resolve_checkpoint

    tr = trainer_cfg
    name = tr.run_name or f"{task_name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    run_dir = run_dir_path(tr.output_dir, name)
    resume_from: Path | None = None
    if tr.checkpointing.resume not in ("never", "auto"):
        try:
            resume_from = resolve_checkpoint(tr.checkpointing.resume)
        except FileNotFoundError as e:
            why = str(e) if Path(tr.checkpointing.resume).exists() else f"{tr.checkpointing.resume} does not exist"
            raise ConfigError(
                f"trainer.checkpointing.resume={tr.checkpointing.resume}: {why}; trainer.checkpointing.resume takes auto (continue "
                "trainer.run_name's run), never, a checkpoint folder (<run dir>/checkpoints/step_N) "
                "or a run directory"
            ) from None
        run_dir = resume_from.parent.parent
    # a folder holding only a lock is new (a run killed before it wrote anything): its lock is taken over below
    exists = run_dir.exists() and any(p.name != LOCK_FILE for p in run_dir.iterdir())
    if exists and resume_from is None and tr.checkpointing.resume != "auto":
        if not tr.checkpointing.overwrite:
            raise ConfigError(
                f"run directory {run_dir} exists; pass trainer.checkpointing.resume=auto to continue it, "
                "trainer.checkpointing.overwrite=true to start over, or another trainer.run_name"
            )
        if is_main:
            refuse_unless_mmrl_run(run_dir)  # only a folder mmrl created is deleted, and only once it is owned
    lock = RunLock.acquire(run_dir) if is_main else None
    try:
        if exists and resume_from is None:
            if tr.checkpointing.resume == "auto":
                resume_from = auto_resume_checkpoint(run_dir, warn=is_main)
            elif is_main:
                clear_run_dir(run_dir, keep=(LOCK_FILE,))
        elif resume_from is None and tr.checkpointing.resume == "auto" and is_main:
            if tr.run_name:
                log.info("trainer.checkpointing.resume=auto: no run %s to continue yet; starting it", run_dir)
            else:  # a timestamped name is new every time: auto can never find a run without trainer.run_name
                log.warning(
                    "trainer.checkpointing.resume=auto without trainer.run_name: no run to continue (a run without a name gets a "
                    "new timestamped directory, here %s); to continue a run pass trainer.run_name=<its folder "
                    "name in %s> trainer.checkpointing.resume=auto (or trainer.checkpointing.resume=<its run dir>)",
                    run_dir,
                    tr.output_dir,
                )
        if resume_from is not None:  # before any weight is loaded
            check_same_experiment(
                run_dir, config, accept=tr.checkpointing.resume_accept_changes, log_changes=is_main, defaults=defaults
            )
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return run_dir, name, resume_from, lock
