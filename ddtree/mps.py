"""A private CUDA MPS server for processes that share one GPU (`ddtree serve --mps`, the
compose file's `mps` service).

With the verifier and the drafter on one GPU as two processes, the GPU time-slices their
two contexts: every round's hand-over between them costs a context switch (~0.28 ms a round
with the demo pair, lease 37). As clients of one MPS server their kernels share the GPU
instead (tree@16 through `ddtree serve` 0.745x -> 0.872x of one process at concurrency 1,
0.818x -> 0.914x at 8, every sample equal to ar's).

`MpsServer` runs `nvidia-cuda-mps-control -f` (the control daemon in the foreground, as this
process's child, so that it dies with it) over a private pipe directory, waits until it
answers, then checks that a CUDA client can run under it (a short torch process on the
device). The children to run under it get CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY
(`env`). At exit it asks the daemon to quit (it stops its server), then removes the
directory. Nothing about the GPU's settings (compute mode) is changed.

Modes: "on" requires it (a clear error when it cannot run); "auto" starts it where it helps
and can run (a CUDA device shared by the drafter and the verifier, the control program on
PATH, no MPS server already in use) and serves without it, saying why, when the check
fails; "off" never starts one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ddtree.errors import DDTreeError
from ddtree.signals import SignalStop

CONTROL = "nvidia-cuda-mps-control"
MODES = ("auto", "on", "off")
# Where clients look when CUDA_MPS_PIPE_DIRECTORY is unset: a daemon there (a system-wide
# one) already serves every CUDA process of its user.
SYSTEM_PIPE_DIR = Path("/tmp/nvidia-mps")
READY_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 180.0
QUIT_TIMEOUT_S = 15.0
IDLE_MARK = "ddtree-mps-idle"  # in the compose service's pipe directory: no daemon, by choice
# A CUDA client under the server: one allocation and a kernel on the device.
_PROBE = ("import sys, torch; d = torch.device(sys.argv[1]); "
          "x = torch.ones(4, device=d) + 1; assert float(x.sum()) == 8.0")


def _say(message: str) -> None:
    print(f"ddtree mps: {message}", flush=True)


def already_running(env: Mapping[str, str]) -> str | None:
    """The pipe directory of an MPS daemon the children would use anyway, if any."""
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
    if pipe:
        return pipe
    return str(SYSTEM_PIPE_DIR) if (SYSTEM_PIPE_DIR / "control").exists() else None


def decide(mode: str, device: str, shared_gpu: bool, env: Mapping[str, str]
           ) -> tuple[bool, str]:
    """(start a private server?, why). `device` is --device ("auto", "cpu", "cuda:N");
    `shared_gpu`: two CUDA processes (drafter and verifier) run on one GPU."""
    if mode not in MODES:
        raise DDTreeError(f"--mps must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return False, "--mps off"
    if device == "cpu":
        if mode == "on":
            raise DDTreeError("--mps on needs a CUDA device (--device is cpu)")
        return False, "the device is the CPU"
    running = already_running(env)
    if running is not None:
        return False, f"the children use the MPS daemon at {running} already"
    if shutil.which(CONTROL, path=env.get("PATH")) is None:
        if mode == "on":
            raise DDTreeError(f"--mps on: {CONTROL} is not on PATH (it comes with the NVIDIA "
                              "driver's utilities)")
        return False, f"{CONTROL} is not on PATH"
    if mode == "auto" and not shared_gpu:
        return False, "no two processes share a GPU (the drafter is in the verifier or apart)"
    return True, "--mps on" if mode == "on" else "the drafter and the verifier share a GPU"


@dataclass
class MpsServer:
    """Context manager: a private MPS control daemon while the block runs (see the module
    docstring). `env` holds what the clients need once it is up (empty when it is not)."""

    device: str
    required: bool
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    env: dict[str, str] = field(default_factory=dict)
    _dir: Path | None = None
    _daemon: subprocess.Popen[bytes] | None = None
    _daemon_env: dict[str, str] = field(default_factory=dict)  # its pipe, its log

    def __enter__(self) -> MpsServer:
        self._dir = Path(tempfile.mkdtemp(prefix="ddtree-mps-"))
        pipe, log = self._dir / "pipe", self._dir / "log"
        pipe.mkdir()
        log.mkdir()
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
        self._daemon_env = {**self.base_env, **env}
        try:
            self._start(self._daemon_env)
            self._probe(self._daemon_env)
        except DDTreeError as error:
            self._stop()
            if self.required:
                raise
            _say(f"serving without MPS: {error}")
            return self
        except BaseException:  # Ctrl-C while starting: no daemon or directory left behind
            self._stop()
            raise
        self.env = env
        _say(f"MPS server up (pipe directory {pipe}); the services run as its clients")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop()

    def _start(self, env: dict[str, str]) -> None:
        from ddtree.cli.supervisor import guarded  # dies with this process (Linux)

        control = shutil.which(CONTROL, path=env.get("PATH"))
        if control is None:
            raise DDTreeError(f"{CONTROL} is not on PATH")
        # its output in a file (a pipe nobody reads would block a chatty daemon)
        output = Path(env["CUDA_MPS_LOG_DIRECTORY"]) / "control.out"
        with output.open("wb") as sink:
            self._daemon = subprocess.Popen(guarded([control, "-f"]), env=env, stdout=sink,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._answers(env):
            if self._daemon.poll() is not None:
                said = output.read_text(errors="replace").strip()[-400:]
                raise DDTreeError(f"{CONTROL} exited with code {self._daemon.returncode}: "
                                  f"{said}")
            if time.monotonic() > deadline:
                raise DDTreeError(f"{CONTROL} did not answer within {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    def _answers(self, env: dict[str, str]) -> bool:
        """The control daemon answers a query on its pipe."""
        return self._command("get_server_list", env, timeout_s=5.0) is not None

    def _command(self, command: str, env: Mapping[str, str], timeout_s: float) -> str | None:
        try:
            done = subprocess.run([CONTROL], input=f"{command}\n".encode(), env=dict(env),
                                  capture_output=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.decode(errors="replace") if done.returncode == 0 else None

    def _probe(self, env: dict[str, str]) -> None:
        device = "cuda" if self.device == "auto" else self.device
        try:
            done = subprocess.run([sys.executable, "-c", _PROBE, device], env=env,
                                  capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as error:
            raise DDTreeError(f"a CUDA client under the MPS server did not finish within "
                              f"{PROBE_TIMEOUT_S:.0f} s") from error
        if done.returncode != 0:
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            raise DDTreeError("a CUDA client could not run under the MPS server: "
                              f"{lines[-1] if lines else f'exit {done.returncode}'}"
                              f"{self._log_tail()}")

    def _log_tail(self) -> str:
        log = self._dir / "log" / "control.log" if self._dir is not None else None
        if log is None or not log.exists():
            return ""
        tail = log.read_text(errors="replace").strip().splitlines()[-2:]
        return f" (control.log: {' | '.join(tail)})" if tail else ""

    def _stop(self) -> None:
        daemon, self._daemon = self._daemon, None
        if daemon is not None and daemon.poll() is None:
            self._command("quit", self._daemon_env, timeout_s=QUIT_TIMEOUT_S)
            try:
                daemon.wait(timeout=QUIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.env = {}


def serve_forever(mode: str, device: str, pipe_dir: Path) -> int:
    """The compose file's `mps` service: the control daemon in the foreground over
    `pipe_dir` (a volume the drafter and the verifier mount, with CUDA_MPS_PIPE_DIRECTORY
    pointing there) until SIGTERM, then quit; with MPS off or unavailable it idles (a client
    whose pipe directory has no daemon runs without MPS)."""
    stop = SignalStop()
    stop.install()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MPS_PIPE_DIRECTORY"}
    start, why = decide(mode, device, shared_gpu=True, env=env)
    control = shutil.which(CONTROL)
    pipe_dir.mkdir(parents=True, exist_ok=True)
    idle = pipe_dir / IDLE_MARK
    idle.unlink(missing_ok=True)
    if not start or control is None:
        _say(f"not starting an MPS server: {why}; the services run without one")
        idle.touch()
        stop.wait()
        return 0
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_dir)
    env.setdefault("CUDA_MPS_LOG_DIRECTORY", str(pipe_dir / "log"))
    Path(env["CUDA_MPS_LOG_DIRECTORY"]).mkdir(parents=True, exist_ok=True)
    daemon = subprocess.Popen([control, "-f"], env=env)
    _say(f"MPS control daemon started (pipe directory {pipe_dir})")
    while not stop.wait(1.0):
        if daemon.poll() is not None:
            _say(f"{CONTROL} exited with code {daemon.returncode}")
            return daemon.returncode or 1
    try:
        subprocess.run([control], input=b"quit\n", env=env, timeout=QUIT_TIMEOUT_S,
                       check=False)
        daemon.wait(timeout=QUIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
    return 0


def healthy(pipe_dir: Path) -> bool:
    """The `mps` service is ready for its clients: idle by choice, or its daemon answers."""
    if (pipe_dir / IDLE_MARK).exists():
        return True
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
    try:
        done = subprocess.run([CONTROL], input=b"get_server_list\n", env=env,
                              capture_output=True, timeout=4.0, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ddtree.mps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mps", choices=MODES, default=os.environ.get("DDTREE_MPS", "off"))
    parser.add_argument("--device", default=os.environ.get("DDTREE_DEVICE", "cuda"))
    parser.add_argument("--pipe-dir", type=Path,
                        default=Path(os.environ.get("DDTREE_MPS_PIPE_DIR", "/run/mps")))
    parser.add_argument("--check", action="store_true",
                        help="exit 0 if the service is ready (its healthcheck)")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if healthy(args.pipe_dir) else 1
    try:
        return serve_forever(args.mps, args.device, args.pipe_dir)
    except DDTreeError as error:
        print(f"ddtree mps: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
