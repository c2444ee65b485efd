"""SIGINT and SIGTERM while a run trains: the first asks the run to stop after its current step (the trainer then
writes its checkpoint and returns), a second one stops it at once (``KeyboardInterrupt``)."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("mmrl.trainer")  # the run's own log: its lines keep the logger name they always had

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a run after its current step."""


class StopSignals:
    """The stop signals of a run: :meth:`catch` installs :meth:`on_signal` for :data:`STOP_SIGNALS` while
    :meth:`mmrl.trainer.Trainer.fit` runs, :meth:`restore` puts the handlers it replaced back. ``received`` is the
    signal that asked the run to stop, None while none has (it stays set after the fit, for the caller to read)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._replaced: dict = {}

    def catch(self) -> None:
        """Handle the stop signals; only in the main thread, where Python delivers signals (a fit in a worker thread
        runs without them)."""
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._replaced[s] = signal.signal(s, self.on_signal)

    def restore(self) -> None:
        """Put back the handlers :meth:`catch` replaced."""
        for s, handler in self._replaced.items():
            signal.signal(s, handler)
        self._replaced = {}

    def on_signal(self, signum, frame) -> None:
        """The handler: the first signal is recorded (the loop stops after the current step), a second one raises
        ``KeyboardInterrupt``."""
        if self.received is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.received = signum
        log.warning(
            "received %s: finishing the current step, saving a checkpoint and exiting", signal.Signals(signum).name
        )
