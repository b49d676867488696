"""An opt-in torch.profiler window over a process's rounds, for tracing the verifier and
the drafter service side by side under real traffic (scripts/trace_merge.py lines their
GPU timelines up: both processes' traces carry the host's clock).

    DDTREE_TRACE_DIR=/path DDTREE_TRACE_ROUNDS=[SKIP:]COUNT ddtree serve ...
    touch /path/go   # once the load runs

Each process counts its rounds (the verifier's engine steps, the drafter's shared-link
drafts) once DIR/go exists, skips SKIP of them (default 0), records the next COUNT
(default 200) and writes DIR/<name>-<pid>.json: one window a process, and one at a time
(a service run in threads records the first). Off, one check a round, unless
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


class RoundTrace:
    def __init__(self, name: str) -> None:
        self.name = name
        self.profiler: Any = None
        directory = os.environ.get(DIR_ENV, "")
        self.enabled = bool(directory)
        self.directory = Path(directory)
        skip, _, count = os.environ.get(ROUNDS_ENV, "200").rpartition(":")
        self.skip, self.left = int(skip or 0), int(count)
        self.triggered = False

    def tick(self) -> None:
        """One round begins."""
        if not self.enabled:
            return
        if not self.triggered:
            self.triggered = (self.directory / "go").exists()
            if not self.triggered:
                return
        if self.skip > 0:
            self.skip -= 1
            return
        if self.profiler is None:
            if not _busy.acquire(blocking=False):
                self.enabled = False  # another window of this process records
                return
            from torch.profiler import ProfilerActivity, profile
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self.profiler = profile(activities=activities)
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
