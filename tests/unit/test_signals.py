"""Stopping on signals without a lock in the handler (ddtree/signals.py). Why: a handler
that sets a `threading.Event` deadlocks when the signal lands while the main thread holds
the event's lock (pinned here deterministically). SignalStop's handler never blocks, a
signal wakes its waiter, a process waiting in a loop as `ddtree serve`'s supervisor does
stops under a burst of SIGTERMs, and a supervisor with two children stops them in order
under one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddtree.signals import SignalStop
from tests.unit.test_supervisor import alive, pid_of, start

ROOT = Path(__file__).resolve().parents[2]
WAITER = """
from ddtree.signals import SignalStop
stop = SignalStop()
stop.install()
print("ready", flush=True)
while not stop.wait(0.2):
    pass
print("stopped", flush=True)
"""
# The pattern SignalStop replaced, with the signal delivered where it hung `ddtree serve`:
# inside Event.wait, the event's lock held (deterministic: raise_signal runs the handler
# before the next line)
EVENT_HAZARD = """
import signal, threading
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
with stop._cond:
    signal.raise_signal(signal.SIGTERM)
print("stopped", flush=True)
"""


def run_python(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def burst(pid: int, count: int = 200, spacing_s: float = 40e-6) -> None:
    """`count` SIGTERMs `spacing_s` apart (busy-waited: sleep's granularity is coarser),
    until the process is gone."""
    for _ in range(count):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        until = time.perf_counter() + spacing_s
        while time.perf_counter() < until:
            pass


def test_a_handler_that_sets_a_threading_event_deadlocks_on_the_events_lock() -> None:
    process = run_python(EVENT_HAZARD)
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=3)
    process.kill()
    process.wait()


def test_the_handler_never_blocks_and_wait_returns_once_set() -> None:
    stop = SignalStop()
    assert not stop.wait(0.01) and not stop.is_set()
    for _ in range(100_000):  # more wake-up bytes than a pipe holds: still no block
        stop.handler(signal.SIGTERM, None)
    assert stop.is_set() and stop.wait(0) and stop.wait(None)


def test_a_signal_wakes_the_waiter() -> None:
    stop = SignalStop()
    previous = stop.install((signal.SIGTERM,))
    try:
        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
        started = time.monotonic()
        timer.start()
        assert stop.wait(10)
        assert time.monotonic() - started < 5
        timer.join()
    finally:
        signal.signal(signal.SIGTERM, previous[signal.SIGTERM])


def test_a_burst_of_sigterms_stops_a_waiting_loop_every_time() -> None:
    for trial in range(20):
        process = run_python(WAITER)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(0.03 + 0.011 * (trial % 9))  # land at different points of the loop
        burst(process.pid, spacing_s=20e-6 * (1 + trial % 4))
        out, _ = process.communicate(timeout=5)  # a hang raises TimeoutExpired
        # the loop saw the stop (a signal during the interpreter's exit, whose handlers
        # are back to the default by then, may still end it with -SIGTERM)
        assert "stopped" in out and process.returncode in (0, -signal.SIGTERM), trial


def test_a_supervisor_stops_its_children_under_a_burst(tmp_path: Path) -> None:
    supervisor = start(tmp_path)
    children = [pid_of(tmp_path, name) for name in ("first", "second")]
    burst(supervisor.pid)
    # stopped in order (no pid file left) and gone (a signal during the interpreter's exit
    # may end it with -SIGTERM instead of 0)
    assert supervisor.wait(timeout=30) in (0, -signal.SIGTERM)
    assert not any(alive(pid) for pid in children)
    assert not list(tmp_path.glob("*.pid"))
