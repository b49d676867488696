"""ddtree/mps.py: when `ddtree serve` starts a private MPS server (decide), and the server's
life (MpsServer): the control daemon in the foreground over a private pipe directory, a CUDA
client checked under it, `quit` at exit and the directory removed; a failed check serves
without MPS under `auto` and is a clear error under `on`.

Without an NVIDIA driver the lifecycle tests run a stand-in control program (a Unix-socket
daemon speaking the same stdin protocol, tests/unit/fake_mps_control.py); the last test runs
the real one where the driver and a GPU are there (the GPU lease runs it)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree.errors import DDTreeError
from ddtree.mps import CONTROL, MpsServer, decide

FAKE = Path(__file__).with_name("fake_mps_control.py")


@pytest.fixture
def fake_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH finds the stand-in as nvidia-cuda-mps-control; the commands
    it receives are appended to tmp_path/commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / CONTROL
    program.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["FAKE_MPS_RECORD"] = str(tmp_path / "commands")
    return env


def test_decide(fake_path: dict[str, str]) -> None:
    no_control = {"PATH": "/nonexistent"}
    assert decide("off", "cuda", True, fake_path) == (False, "--mps off")
    assert decide("auto", "cpu", True, fake_path)[0] is False
    assert decide("auto", "cuda:0", True, fake_path)[0] is True
    assert decide("auto", "auto", True, fake_path)[0] is True
    # apart (another GPU, colocated, tensor parallel): nothing to share
    assert decide("auto", "cuda:0", False, fake_path)[0] is False
    assert decide("on", "cuda:0", False, fake_path)[0] is True
    # the program is not there: auto says why, on refuses
    start, why = decide("auto", "cuda", True, no_control)
    assert not start and CONTROL in why
    with pytest.raises(DDTreeError, match="not on PATH"):
        decide("on", "cuda", True, no_control)
    with pytest.raises(DDTreeError, match="CUDA device"):
        decide("on", "cpu", True, fake_path)
    # a daemon the children would use anyway (the user's own, by its pipe directory)
    start, why = decide("on", "cuda", True, {**fake_path, "CUDA_MPS_PIPE_DIRECTORY": "/x"})
    assert not start and "/x" in why
    with pytest.raises(DDTreeError, match="--mps must be one of"):
        decide("sometimes", "cuda", True, fake_path)


def test_the_server_runs_while_the_block_does_and_quits_after(
        fake_path: dict[str, str], tmp_path: Path) -> None:
    # device "cpu": the client check (a torch process) runs where this machine can
    with MpsServer("cpu", required=True, base_env=fake_path) as mps:
        pipe = Path(mps.env["CUDA_MPS_PIPE_DIRECTORY"])
        assert (pipe / "control").exists()
        assert Path(mps.env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        # a client of the children's environment reaches the daemon
        done = subprocess.run([shutil.which(CONTROL, path=fake_path["PATH"]) or ""],
                              input=b"get_server_list\n", env={**fake_path, **mps.env},
                              capture_output=True, check=True)
        assert done.returncode == 0
    assert not pipe.parent.exists()  # the private directory is gone
    assert mps.env == {}
    commands = (tmp_path / "commands").read_text().split()
    assert commands[-1] == "quit" and "get_server_list" in commands


def test_a_failed_client_check_serves_without_mps_under_auto_and_fails_under_on(
        fake_path: dict[str, str]) -> None:
    # a device this process cannot use: the client check fails like a server that
    # refuses its clients (another user's server on the GPU, say)
    with MpsServer("cuda:999", required=False, base_env=fake_path) as mps:
        assert mps.env == {}
    with pytest.raises(DDTreeError, match="could not run under the MPS server"), \
            MpsServer("cuda:999", required=True, base_env=fake_path):
        pass


def test_a_control_daemon_that_cannot_start_is_reported(fake_path: dict[str, str]) -> None:
    env = {**fake_path, "FAKE_MPS_FAIL": "1"}
    with pytest.raises(DDTreeError, match="exited with code 3: cannot start"), \
            MpsServer("cpu", required=True, base_env=env):
        pass


def test_serve_refuses_mps_on_for_the_cpu() -> None:
    done = subprocess.run([sys.executable, "-m", "ddtree.cli", "serve", "--mode", "ar",
                           "--target", str(Path(__file__).parent), "--device", "cpu",
                           "--mps", "on"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--mps on needs a CUDA device" in done.stderr


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(shutil.which(CONTROL) is None or not _cuda_available(),
                    reason="needs the NVIDIA driver's MPS control program and a GPU")
def test_a_real_mps_server_serves_a_cuda_client() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    with MpsServer("cuda", required=True, base_env=env) as mps:
        assert mps.env
        done = subprocess.run([CONTROL], input=b"get_server_list\n", env={**env, **mps.env},
                              capture_output=True, check=True)
        # the client check started a server (one pid per line)
        assert done.stdout.split(), done


def _wait_healthy(pipe: Path, env: dict[str, str], process: subprocess.Popen[str]) -> None:
    import time

    deadline = time.monotonic() + 60
    while subprocess.run([sys.executable, "-m", "ddtree.mps", "--check", "--pipe-dir",
                          str(pipe)], env=env, check=False).returncode != 0:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the mps service never became healthy"
        time.sleep(0.2)


@pytest.mark.parametrize("mode", ["off", "on"])
def test_the_compose_service_idles_or_runs_the_daemon_until_sigterm(
        mode: str, fake_path: dict[str, str], tmp_path: Path) -> None:
    """`python -m ddtree.mps` (compose's `mps` service): off, it idles and is healthy (its
    clients run without MPS); on, it runs the control daemon over the pipe directory and
    is healthy once that answers; SIGTERM quits the daemon and exits 0."""
    import signal

    pipe = tmp_path / "run-mps"
    env = {**fake_path, "DDTREE_MPS": mode, "DDTREE_DEVICE": "cuda"}
    process = subprocess.Popen([sys.executable, "-m", "ddtree.mps", "--pipe-dir", str(pipe)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        _wait_healthy(pipe, env, process)
        assert (pipe / "control").exists() == (mode == "on")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    if mode == "on":
        assert (tmp_path / "commands").read_text().split()[-1] == "quit"
        assert "MPS control daemon started" in output
    else:
        assert "not starting an MPS server: --mps off" in output


def _serve_args(tmp_path: Path, *extra: str) -> object:
    import argparse

    from ddtree.cli import serve

    for name in ("target", "drafter"):
        (tmp_path / name).mkdir(exist_ok=True)
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    return parser.parse_args(["serve", "--target", str(tmp_path / "target"), "--drafter",
                              str(tmp_path / "drafter"), "--mode", "tree", *extra])


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_serve_runs_its_children_without_mps_when_the_client_check_fails(
        mode: str, fake_path: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`ddtree serve` on a CUDA device this machine cannot use (the client check fails,
    as on a GPU another user's MPS server holds): auto hands its children no MPS pipe
    and says why; on refuses to start. The supervisor is replaced by one that records
    what it would run."""
    from ddtree.cli import serve
    from ddtree.cli.supervisor import Supervisor

    seen: list[Supervisor] = []
    monkeypatch.setattr(Supervisor, "run", lambda self: seen.append(self) or 0)
    for key in list(os.environ):
        if key.startswith("CUDA_MPS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", fake_path["PATH"])
    args = _serve_args(tmp_path, "--device", "cuda:999", "--mps", mode)
    if mode == "on":
        with pytest.raises(DDTreeError, match="could not run under the MPS server"):
            serve.run(args)
        return
    assert serve.run(args) == 0
    (supervisor,) = seen
    assert not any(key.startswith("CUDA_MPS_") for key in supervisor.env)
    assert "under an MPS server" not in supervisor.banner
    assert "serving without MPS" in capsys.readouterr().out
    # the drafter, the verifier and the gateway, as without --mps
    assert [child.name for child in supervisor.children] == ["drafter", "verifier", "gateway"]


def test_serve_starts_no_server_where_nothing_shares_a_gpu(
        fake_path: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ddtree.cli import serve
    from ddtree.cli.supervisor import Supervisor

    seen: list[Supervisor] = []
    monkeypatch.setattr(Supervisor, "run", lambda self: seen.append(self) or 0)
    monkeypatch.setenv("PATH", fake_path["PATH"])
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    for extra in (("--colocate-drafter",), ("--drafter-gpu", "1", "--verifier-gpu", "0")):
        assert serve.run(_serve_args(tmp_path, "--device", "cuda", *extra)) == 0
        assert not any(key.startswith("CUDA_MPS_") for key in seen[-1].env)
        assert "no MPS server: no two processes share a GPU" in capsys.readouterr().out
    assert not (tmp_path / "commands").exists()  # no daemon was started
