"""Body of an :class:`EnvPool` worker process: build the envs, then serve the parent's commands.

Messages: the parent sends ``(command, payload)`` with command "attach" (no reply), "reset",
"step", "call", "pid" or "close"; the worker answers ``(kind, value, busy_s)`` with kind "ok",
"error" (then it exits) or, once at start, "ready" / "start_error".
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any, TextIO

import numpy as np

from .env_group import EnvGroup, import_env_modules
from .errors import EnvPoolError
from .shared_frames import attach_frame_buffer


def worker_main(
    conn: Any,
    worker_id: int,
    env_specs: list[tuple[str, dict]],
    env_offset: int,
    image_key: str,
    import_modules: list[str],
    invalidate_on_sim_error: bool,
    heartbeats: Any,
    trace_path: str,
) -> None:
    """Body of a worker process: build the envs, then serve commands until ``close`` or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the parent, which closes us
    trace_file = _enable_stack_dumps(trace_path)  # noqa: F841 - must stay open for faulthandler

    def beat() -> None:
        heartbeats[worker_id] = time.monotonic()

    try:
        import_env_modules(import_modules)
        group = EnvGroup(
            env_specs, image_key=image_key, invalidate_on_sim_error=invalidate_on_sim_error, heartbeat=beat
        )
        conn.send(("ready", {"spec": group.spec(), "pid": os.getpid()}, 0.0))
    except BaseException:  # noqa: BLE001 - anything, including SystemExit from a bad env
        conn.send(("start_error", traceback.format_exc(), 0.0))
        return
    _serve(conn, group, worker_id, env_offset)


def _enable_stack_dumps(trace_path: str) -> TextIO:
    """Write the Python stack to ``trace_path`` on a fatal signal (segfault in GL...) and on SIGUSR1."""
    import faulthandler

    trace_file = open(trace_path, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.enable(file=trace_file, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=trace_file, all_threads=True)
    return trace_file


def _serve(conn: Any, group: EnvGroup, worker_id: int, env_offset: int) -> None:
    """Answer commands until ``close``, EOF or an error (reported to the parent, which restarts us)."""
    images: np.ndarray | None = None
    shm = None
    while True:
        try:
            command, payload = conn.recv()
        except (EOFError, OSError):  # parent gone
            break
        started = time.perf_counter()
        try:
            if command == "attach":
                shm, images = attach_frame_buffer(payload["name"], payload["shape"])
                continue  # no reply: the parent does not wait for this one
            if command == "close":
                break
            reply = _execute(group, worker_id, command, payload)
            if images is not None and command in ("reset", "step"):
                _move_frames(images, env_offset, command, payload, reply)
            conn.send(("ok", reply, time.perf_counter() - started))
        except BaseException:  # noqa: BLE001 - the parent decides what to do (it restarts us)
            try:
                conn.send(("error", traceback.format_exc(), time.perf_counter() - started))
            except Exception:  # noqa: BLE001
                pass
            break
    group.close()
    if shm is not None:
        images = None
        shm.close()


def _execute(group: EnvGroup, worker_id: int, command: str, payload: Any) -> Any:
    """Run one env command on the group; its reply."""
    if command == "reset":
        return group.reset(payload)
    if command == "step":
        actions, active = payload
        return group.step(actions, active)
    if command == "call":
        return group.call(*payload)
    if command == "pid":
        return os.getpid()
    raise EnvPoolError(f"worker {worker_id}: unknown command {command!r}")


def _move_frames(images: np.ndarray, env_offset: int, command: str, payload: Any, reply: list) -> None:
    """Write the results' images into the shared frame buffer and drop them from the reply."""
    local = range(len(reply)) if command == "step" else [i for i, _ in payload]
    for i, result in zip(local, reply):
        if result is not None and result["image"] is not None:
            images[env_offset + i] = result["image"]
            result["image"] = None  # travelled through shared memory
