"""Stopping on SIGINT / SIGTERM without taking a lock in the signal handler.

A Python signal handler runs in the main thread, between two bytecodes of whatever it
interrupted. `threading.Event.set` takes the event's lock, and a main thread blocked in
`Event.wait` holds that same lock for a moment each time it wakes (after every timeout,
and when a first signal's `set` woke it): a signal landing there ran a handler that waited
for a lock its own thread held, for ever. `ddtree serve` then hung instead of stopping
(seen on a CPU `ddtree serve` stopped through `timeout` and `pkill`, which delivered
SIGTERM twice; bursts of SIGTERMs hung a loop of that pattern in 1 to 9 of 30 trials;
tests/unit/test_signals.py pins it deterministically). Here the handler only sets a flag
and writes one byte to a pipe (the self-pipe trick), and waiting is a `select` on the
pipe's other end, which the byte wakes (and which a signal interrupts and Python retries
after the handler ran).
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalStop:
    """A stop flag that signal handlers may set: `set`, `is_set` and `wait(timeout)` like
    `threading.Event`'s, waited on by one thread (the main one)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._flag = False

    def set(self) -> None:
        """Safe in a signal handler: no lock, never blocks."""
        self._flag = True
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:  # the pipe is full of earlier wake-ups: awake already
            pass

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        """Until set or `timeout` seconds passed (None: until set); -> whether set."""
        if not self._flag:
            select.select([self._read], [], [], timeout)
        return self._flag

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.set()

    def install(self, signals: Iterable[int] = STOP_SIGNALS) -> dict[int, Any]:
        """Makes each of `signals` set this flag, for the life of the process (a second
        signal during the stop changes nothing); -> the handlers it replaced."""
        return {sig: signal.signal(sig, self.handler) for sig in signals}
