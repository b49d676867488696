"""Keeps child processes running: starts them in order, each once the one before is
healthy, then restarts any that dies (exponential backoff, reset once it has stayed up),
until SIGINT / SIGTERM; then stops them in reverse order. Children run in sessions of
their own (a terminal's Ctrl-C reaches only the supervisor, which stops them in order)
and die with the supervisor even if it is killed (PR_SET_PDEATHSIG on Linux).

No Python runs between fork and exec (no `preexec_fn`): the supervisor has gRPC threads
(its health checks), and a forked child that runs Python code while another thread held
a lock at the fork can hang before it ever execs. The death signal is set instead by a
short Python prologue in the child (`_GUARD`), which then execs the real command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddtree.errors import DDTreeError
from ddtree.signals import SignalStop

# How long a child may take to exit after SIGTERM before it is killed.
STOP_GRACE_S = 15.0
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.5, 30.0
# A child up this long has recovered: its next death restarts it at MIN_BACKOFF_S again.
STABLE_AFTER_S = 60.0
POLL_S = 0.2  # health endpoints answer at once; this paces the loop
NOTE_EVERY_S = 30.0  # while a child is slow to start, say so this often


class ChildDied(DDTreeError):
    """A child exited while the services were first starting (a setup error, not a crash)."""


@dataclass
class Child:
    name: str
    argv: list[str]
    is_ready: Callable[[], bool]
    address: str
    process: subprocess.Popen[bytes] | None = None
    state: str = "stopped"  # stopped -> starting -> ready (-> stopped when it dies)
    started_at: float = 0.0
    ready_at: float = 0.0
    restart_at: float = 0.0
    backoff_s: float = MIN_BACKOFF_S
    num_restarts: int = 0
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the supervisor's
    on_exit: Callable[[int], None] | None = None  # called with a dead process's pid


# argv: parent pid, then the command. PR_SET_PDEATHSIG (1) survives exec; the parent-pid
# check closes the race of a supervisor that died before the prctl.
_GUARD = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
          "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])")


def guarded(argv: list[str]) -> list[str]:
    """`argv`, run so that it gets SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", _GUARD, str(os.getpid()), *argv]


def say(message: str) -> None:
    print(f"ddtree serve: {message}", flush=True)


@dataclass
class Supervisor:
    children: list[Child]
    env: Mapping[str, str]
    startup_timeout_s: float
    pid_dir: Path | None = None
    banner: str = ""  # said once every child is first healthy
    stop: SignalStop = field(default_factory=SignalStop)  # SIGINT / SIGTERM set it

    def run(self) -> int:
        """Blocks until a signal; -> 0. Raises ChildDied / DDTreeError if a child cannot
        be started in the first place. Its handlers stay for the life of the process:
        a signal during or after the stop (a second Ctrl-C) changes nothing."""
        self.stop.install()
        try:
            if self.pid_dir is not None:
                self.pid_dir.mkdir(parents=True, exist_ok=True)
                self._write_pid("serve", os.getpid())
            for child in self.children:
                self._start(child)
                self._wait_first_ready(child)
                if self.stop.is_set():
                    return 0
            if self.banner:
                say(self.banner)
            while not self.stop.wait(POLL_S):
                for child in self.children:
                    self._tend(child)
            return 0
        finally:
            self._stop_all()

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(guarded(child.argv), env={**self.env, **child.env},
                                         start_new_session=True)
        child.state, child.started_at = "starting", time.monotonic()
        self._write_pid(child.name, child.process.pid)

    def _wait_first_ready(self, child: Child) -> None:
        assert child.process is not None
        started = time.monotonic()
        deadline, next_note = started + self.startup_timeout_s, started + NOTE_EVERY_S
        while not self.stop.is_set() and not child.is_ready():
            if time.monotonic() > next_note:
                say(f"waiting for {child.name} to be healthy ({time.monotonic() - started:.0f} s)")
                next_note += NOTE_EVERY_S
            if child.process.poll() is not None:
                raise ChildDied(f"{child.name} exited with code {child.process.returncode} "
                                "while starting")
            if time.monotonic() > deadline:
                raise DDTreeError(f"{child.name} was not healthy within "
                                  f"{self.startup_timeout_s:.0f} s")
            self.stop.wait(POLL_S)
        self._mark_ready(child)

    def _mark_ready(self, child: Child) -> None:
        assert child.process is not None
        child.state, child.ready_at = "ready", time.monotonic()
        say(f"{child.name} ready (pid {child.process.pid}, {child.address})")

    def _tend(self, child: Child) -> None:
        """One look at a child: note its death, restart it when its backoff is over,
        promote it to ready once healthy."""
        now = time.monotonic()
        process = child.process
        if child.state != "stopped" and process is not None and process.poll() is not None:
            self._on_death(child, process.returncode, now)
        elif child.state == "stopped" and now >= child.restart_at:
            child.num_restarts += 1
            self._start(child)
        elif child.state == "starting":
            if child.is_ready():
                self._mark_ready(child)
            elif now - child.started_at > self.startup_timeout_s:
                say(f"{child.name} was not healthy within {self.startup_timeout_s:.0f} s; "
                    "killing it")
                self._terminate(child)

    def _on_death(self, child: Child, code: int, now: float) -> None:
        if child.on_exit is not None and child.process is not None:
            child.on_exit(child.process.pid)
        if child.state == "ready" and now - child.ready_at > STABLE_AFTER_S:
            child.backoff_s = MIN_BACKOFF_S
        child.state, child.restart_at = "stopped", now + child.backoff_s
        say(f"{child.name} exited with code {code}; restarting it in {child.backoff_s:.1f} s")
        child.backoff_s = min(child.backoff_s * 2, MAX_BACKOFF_S)

    def _terminate(self, child: Child) -> None:
        process = child.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            say(f"{child.name} did not stop; killing it")
            process.kill()
            process.wait()

    def _stop_all(self) -> None:
        """SIGTERM in reverse start order (gateway first), then SIGKILL what lingers."""
        for child in reversed(self.children):
            if child.process is not None and child.process.poll() is None:
                child.process.terminate()
        for child in reversed(self.children):
            self._terminate(child)
            self._remove_pid(child.name)
        self._remove_pid("serve")

    def _write_pid(self, name: str, pid: int) -> None:
        if self.pid_dir is None:
            return
        partial = self.pid_dir / f".{name}.pid.partial"
        partial.write_text(f"{pid}\n")
        partial.replace(self.pid_dir / f"{name}.pid")  # readers never see half a file

    def _remove_pid(self, name: str) -> None:
        if self.pid_dir is not None:
            (self.pid_dir / f"{name}.pid").unlink(missing_ok=True)
