"""The supervisor behind `ddtree serve`, with stand-in children (sleeping processes): a
child that dies is restarted and its pid file follows; SIGTERM stops everything with exit
0; a supervisor killed outright takes its children with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SUPERVISE = """
import os, sys
from pathlib import Path
from ddtree.cli.supervisor import Child, Supervisor
sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
children = [Child(name, sleeper, lambda: True, name) for name in ("first", "second")]
sys.exit(Supervisor(children, os.environ, 30.0, Path(sys.argv[1]), "all up").run())
"""


def start(pid_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", SUPERVISE, str(pid_dir)],
                               stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    for line in process.stdout:
        if "all up" in line:
            return process
    raise AssertionError(f"the supervisor exited with {process.wait()}")


def pid_of(pid_dir: Path, name: str) -> int:
    return int((pid_dir / f"{name}.pid").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    status = Path(f"/proc/{pid}/stat")
    return not status.exists() or status.read_text().split()[2] != "Z"


def wait_until(condition, timeout_s: float = 20.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)  # polling pid files and /proc


def test_a_dead_child_is_restarted_and_sigterm_stops_all_with_exit_0(tmp_path: Path) -> None:
    supervisor = start(tmp_path)
    first = pid_of(tmp_path, "first")
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: pid_of(tmp_path, "first") != first)
    restarted, second = pid_of(tmp_path, "first"), pid_of(tmp_path, "second")
    assert alive(restarted) and alive(second)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    assert not alive(restarted) and not alive(second)
    assert not list(tmp_path.glob("*.pid"))


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    supervisor = start(tmp_path)
    children = [pid_of(tmp_path, name) for name in ("first", "second")]
    supervisor.kill()
    supervisor.wait(timeout=30)
    wait_until(lambda: not any(alive(pid) for pid in children))
