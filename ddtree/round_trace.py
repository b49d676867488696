"""An opt-in torch.profiler window over a process's rounds, for tracing the verifier and
the drafter service side by side under real traffic (scripts/trace_merge.py lines their
GPU timelines up: both processes' traces carry the host's clock).

    DDTREE_TRACE_DIR=/path DDTREE_TRACE_ROUNDS=SKIP:COUNT ddtree serve ...

The engine (the leader) counts its steps, and after SKIP of them creates DIR/go and
records the next COUNT; every other process (the drafter service's shared link) records
COUNT of its rounds from its first round after DIR/go appears. So the windows start
within a round of each other. Each writes DIR/<name>-<pid>.json: one window a process,
one at a time (a service run in threads records the first). The profiler is started and
stopped once when the trace is set up, so that its first start inside traffic is quick
(a slow one would exceed the shared link's deadline). Off, one check a round, unless
DDTREE_TRACE_DIR is set.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import structlog
import torch

log = structlog.get_logger("ddtree.round_trace")

ROUNDS_ENV, DIR_ENV = "DDTREE_TRACE_ROUNDS", "DDTREE_TRACE_DIR"
MARK = "ddtree.round"  # a zero-length range at each traced round's start
_busy = threading.Lock()


def _activities() -> list[Any]:
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


class RoundTrace:
    def __init__(self, name: str, leader: bool = False) -> None:
        self.name = name
        self.profiler: Any = None
        directory = os.environ.get(DIR_ENV, "")
        self.enabled = bool(directory)
        self.directory = Path(directory)
        skip, _, count = os.environ.get(ROUNDS_ENV, "200").rpartition(":")
        self.leader = leader
        self.skip, self.left = (int(skip or 0) if leader else 0), int(count)
        self.triggered = False
        if self.enabled:
            if not _busy.acquire(blocking=False):
                self.enabled = False  # another window of this process records
                return
            from torch.profiler import profile
            try:
                with profile(activities=_activities()):
                    pass  # the profiler's own set-up, now rather than in traffic
            finally:
                _busy.release()

    def tick(self) -> None:
        """One round begins."""
        if not self.enabled:
            return
        if not self.triggered:
            if self.leader:
                self.skip -= 1
                if self.skip >= 0:
                    return
                self.directory.mkdir(parents=True, exist_ok=True)
                (self.directory / "go").touch()
            elif not (self.directory / "go").exists():
                return
            self.triggered = True
        if self.profiler is None:
            if not _busy.acquire(blocking=False):
                self.enabled = False  # another window of this process records
                return
            from torch.profiler import profile
            self.profiler = profile(activities=_activities())
            self.profiler.start()
        with torch.profiler.record_function(MARK):
            pass
        self.left -= 1
        if self.left <= 0:
            self._write()

    def _write(self) -> None:
        self.profiler.stop()
        path = self.directory / f"{self.name}-{os.getpid()}.json"
        self.profiler.export_chrome_trace(str(path))
        log.info("round_trace_written", path=str(path))
        self.profiler, self.enabled = None, False
        _busy.release()
