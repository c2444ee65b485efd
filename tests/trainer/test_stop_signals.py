"""SIGINT / SIGTERM while a run trains (:class:`mmrl.stop_signals.StopSignals`): the first one is recorded for the
loop to stop after its step, a second one stops the run at once; the handlers are installed only in the main thread
and the ones they replaced come back."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from mmrl.stop_signals import StopSignals


def test_the_first_signal_is_recorded_and_a_second_stops_at_once(caplog):
    stops = StopSignals()
    assert stops.received is None
    with caplog.at_level(logging.WARNING, logger="mmrl.trainer"):
        stops.on_signal(signal.SIGTERM, None)
    assert stops.received == signal.SIGTERM
    assert "received SIGTERM: finishing the current step, saving a checkpoint and exiting" in caplog.text
    with pytest.raises(KeyboardInterrupt):
        stops.on_signal(signal.SIGINT, None)
    assert stops.received == signal.SIGTERM  # the stop that is reported stays the first one


def test_catch_replaces_both_handlers_and_restore_puts_them_back():
    stops = StopSignals()
    mine = {s: (lambda signum, frame: None) for s in (signal.SIGINT, signal.SIGTERM)}
    before = {s: signal.signal(s, h) for s, h in mine.items()}
    try:
        stops.catch()
        assert [signal.getsignal(s) for s in mine] == [stops.on_signal, stops.on_signal]
        stops.restore()
        assert [signal.getsignal(s) for s in mine] == list(mine.values())
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_catch_in_a_worker_thread_installs_nothing():
    stops = StopSignals()
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    errors = []

    def catch():
        try:
            stops.catch()
        except Exception as e:  # noqa: BLE001 - what a fit in a worker thread would raise
            errors.append(e)

    worker = threading.Thread(target=catch)
    worker.start()
    worker.join()
    assert errors == []
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before
    stops.restore()  # nothing replaced: nothing to put back
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before
