"""House rules that tools check: ruff over the tree, mypy over the services and gateway."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean_on_the_services_and_the_gateway() -> None:
    result = run("mypy", "drafter_svc", "verifier_svc", "gateway")
    assert result.returncode == 0, result.stdout + result.stderr
