"""scripts/gpu/check_kernels.py runs end to end on tiny shapes under the interpreter: the
GPU lease must not be the first place it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs for real")
def test_gpu_check_script_passes_quick_under_the_interpreter(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "scripts/gpu/check_kernels.py", "--quick"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "kernels.json").read_text())
    assert summary["checks"] and all(check["ok"] for check in summary["checks"])
    kernels = {row["kernel"] for row in summary["timings"]}
    assert kernels == {"linear", "tree_attention", "rms_norm", "rope_store", "silu_mul",
                       "vocab_topk"}
    assert not summary["timing_errors"]
