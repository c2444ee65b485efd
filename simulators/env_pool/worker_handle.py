"""Parent-side handle of one :class:`EnvPool` worker process: start, stack dump, death report, kill."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from .worker import worker_main


@dataclass
class WorkerHandle:
    """Parent-side handle of one worker process."""

    process: Any = None
    conn: Any = None
    trace_path: str = ""
    ready: bool = False
    pid: int | None = None

    def start(self, ctx: Any, w: int, worker_args: tuple) -> None:
        """Start worker ``w`` running ``worker_main(conn, w, *worker_args, trace_path)`` with a new
        pipe and stack-trace file (the handle is updated in place; ``ready`` is False)."""
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        fd, trace_path = tempfile.mkstemp(prefix=f"mmrl_envpool_w{w}_", suffix=".trace")
        os.close(fd)
        process = ctx.Process(
            target=worker_main,
            args=(child_conn, w, *worker_args, trace_path),
            name=f"mmrl-envpool-{w}",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            os.unlink(trace_path)
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        self.process, self.conn, self.trace_path, self.ready, self.pid = (
            process,
            parent_conn,
            trace_path,
            False,
            process.pid,
        )

    def read_trace(self) -> str:
        """What the worker's faulthandler wrote (fatal signal, SIGUSR1); '' if nothing."""
        try:
            with open(self.trace_path) as f:
                return f.read().strip()
        except OSError:
            return ""

    def death_text(self) -> str:
        """Exit code of the dead process and its faulthandler dump, if any."""
        self.process.join(timeout=1.0)
        text = f"process {self.pid} died with exit code {self.process.exitcode}"
        trace = self.read_trace()
        return f"{text}\n{trace}" if trace else text

    def dump_stack(self) -> str:
        """Ask a stuck worker for its Python stack (faulthandler on SIGUSR1); '' if unavailable."""
        if not hasattr(signal, "SIGUSR1") or not self.process.is_alive():
            return ""
        try:
            os.kill(self.process.pid, signal.SIGUSR1)
        except OSError:
            return ""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            text = self.read_trace()
            if text:
                time.sleep(0.02)  # let it finish writing
                return self.read_trace()
            time.sleep(0.02)
        return ""

    def kill(self) -> None:
        """Kill the process, close the pipe, remove the trace file."""
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=5.0)
        if self.conn is not None:
            self.conn.close()
        if self.trace_path and os.path.exists(self.trace_path):
            os.unlink(self.trace_path)
        self.ready = False


def cleanup_processes(workers: list[WorkerHandle], shm: Any) -> None:
    """Last-resort cleanup (garbage collection or interpreter exit without ``close``)."""
    for worker in workers:
        if worker.process is not None and worker.process.is_alive():
            worker.process.kill()
        if worker.trace_path and os.path.exists(worker.trace_path):
            os.unlink(worker.trace_path)
    if shm is not None:
        try:
            shm.close()
            shm.unlink()
        except (FileNotFoundError, BufferError):
            pass
