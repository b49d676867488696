"""A checkpoint path that does not exist is a clear error at once, never read as a hub
name (no download at run time): the gateway's --target / --tokenizer, ddtree serve's."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import REPO

MISSING = "/nonexistent/ddtree-checkpoint"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "0", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)


def test_the_gateway_refuses_a_tokenizer_path_that_does_not_exist() -> None:
    for flag in ("--target", "--tokenizer"):
        result = run("-m", "gateway", "--verifier-addr", "127.0.0.1:1", flag, MISSING)
        assert result.returncode == 2, result.stderr
        assert "does not exist" in result.stderr and MISSING in result.stderr
        assert "huggingface" not in result.stderr.lower()


def test_serve_refuses_checkpoint_paths_that_do_not_exist() -> None:
    result = run("-m", "ddtree.cli", "serve", "--target", MISSING, "--drafter", MISSING)
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert "ready" not in result.stdout  # no child was started
