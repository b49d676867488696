"""Programmatic dependent launch (ddtree/kernels/launch.py): who launches dependently, and
that every kernel compiled for it waits for the previous kernel before touching memory
(compiled for sm_90 on this machine through the NVIDIA backend the triton wheel carries,
in a process without the interpreter; no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddtree.kernels import launch

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"_linear_kernel", "_split_k_reduce_kernel", "_rms_norm_kernel", "_rope_store_kernel",
           "_silu_mul_kernel", "_tree_attention_split_kernel", "_tree_attention_combine_kernel",
           "_tree_build_kernel", "_leaf_topk_kernel", "_merge_topk_kernel",
           "_linear_rope_kernel", "_gather_rows_kernel", "_block_inputs_kernel"}
PREFETCHING = {"_linear_kernel", "_tree_attention_split_kernel", "_linear_rope_kernel"}


def test_the_cpu_and_the_interpreter_never_launch_dependently() -> None:
    assert not launch.use_pdl(torch.zeros(1))
    assert launch.launch_kwargs(False) == {}
    assert launch.launch_kwargs(True) == {"launch_pdl": True}


def test_set_pdl_switches_and_returns_the_old_setting() -> None:
    before = launch.pdl_enabled()
    try:
        assert launch.set_pdl(False) == before
        assert not launch.pdl_enabled()
        assert launch.set_pdl(True) is False
        assert launch.pdl_enabled()
    finally:
        launch.set_pdl(before)


@pytest.fixture(scope="module")
def reports() -> dict[bool, list[dict[str, object]]]:
    """Both compiles (with and without PDL), in two processes at once."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    running = {pdl: subprocess.Popen(
        [sys.executable, "-m", "tests.kernels.compile_sm90", "--pdl", "on" if pdl else "off"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for pdl in (True, False)}
    out = {}
    for pdl, process in running.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-4000:]
        report: list[dict[str, object]] = json.loads(stdout.strip().splitlines()[-1])
        assert {row["kernel"] for row in report} >= KERNELS, report
        out[pdl] = report
    return out


def test_every_kernel_waits_for_the_previous_one_before_any_memory_access(reports) -> None:
    for row in reports[True]:
        assert row["launch_pdl"], row
        assert row["waits"] == 1 and row["launch_dependents"] == 1, row
        assert row["wait_before_launch"] and row["writes_before_wait"] == 0, row
        if row["kernel"] == "_tree_attention_split_kernel":
            # its pool row and prefix length, clamped into the pool, address the prefetch
            # only; every load the result depends on follows the wait
            assert row["loads_before_wait"] == 2, row
        else:
            assert row["wait_before_memory"], row
        # the GEMMs ask for their weights (never written by a kernel) and tree attention
        # for its prefix K/V before they wait
        assert row["prefetch_before_wait"] == (row["kernel"] in PREFETCHING), row


def test_without_pdl_the_kernels_carry_no_grid_dependency_control(reports) -> None:
    for row in reports[False]:
        assert not row["launch_pdl"], row
        assert row["waits"] == 0 and row["launch_dependents"] == 0, row
        assert not row["prefetch_before_wait"], row
