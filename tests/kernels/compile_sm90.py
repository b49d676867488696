"""Compile the kernels for an H200 (sm_90) on a machine without a GPU, and read what came
out: registers, spills, shared memory, the matrix instructions, and whether the two loops of
the tree-attention split kernel emit the same float operations. No launch; a stand-in
driver lets `JITFunction.run` compile through the real NVIDIA backend (LLVM, ptxas) that
the triton wheel carries. Uses triton internals: a tool, not a test.

    PYTHONPATH=. python -m tests.kernels.compile_sm90    # (a triton 3.6 on PYTHONPATH
                                                          #  compiles what the H200 host will)
    PYTHONPATH=. python -m tests.kernels.compile_sm90 --pdl on|off   # JSON: per kernel, the
        launch_pdl flag and where griddepcontrol sits in the PTX (tests/kernels/test_launch.py)
    PYTHONPATH=. python -m tests.kernels.compile_sm90 --attention-loops | --attention-stages
        # JSON: tree attention's key loops agree; its wide-launch stages agree (--attention:
        # both, as {"loops": ..., "stages": ...})
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

import ddtree.kernels.draft_prologue as draft_prologue
import ddtree.kernels.matmul as matmul
import ddtree.kernels.rmsnorm as rmsnorm_module
import ddtree.kernels.rope as rope_module
import ddtree.kernels.round_commit as round_commit
import ddtree.kernels.swiglu as swiglu_module
import ddtree.kernels.tree_attention as attention
import ddtree.kernels.tree_build as tree_build
import ddtree.kernels.vocab_topk as vocab_topk
from ddtree.kernels.fused_linear import linear_norm, norm_linear, swiglu_down
from ddtree.kernels.matmul import PendingLinear, SplitPartials
from ddtree.kernels.rmsnorm import rms_norm
from ddtree.kernels.rope import rope_store
from ddtree.kernels.swiglu import silu_mul
from ddtree.tree import _beam_widths

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
FLOAT_OP = re.compile(r"\b(HMMA|HGMMA|FADD|FMUL|FFMA|MUFU|FMNMX|F2FP|FSEL|FSETP)[.A-Z0-9_]*")


class StandInCuda:
    """Just enough of a CUDA driver for triton to pick the sm_90 target and compile."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def compile_everything() -> list[tuple[str, object]]:
    """Run every launcher on CPU tensors with the GPU's choices; collect the binaries."""
    compiled: list[tuple[str, object]] = []
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.__name__, kernel))
        return kernel

    driver.set_active(StandInCuda())  # for this process: there is no real one to restore
    JITFunction.run = compile_only
    gpu_dot = matmul.dot_in_float32  # on CPU tensors it would pick the interpreter's upcast
    matmul.dot_in_float32 = attention.dot_in_float32 = rope_module.dot_in_float32 = (
        lambda x: x.dtype == torch.float32)
    try:
        _launch_all()
    finally:
        JITFunction.run = run
        matmul.dot_in_float32 = attention.dot_in_float32 = rope_module.dot_in_float32 = gpu_dot
    return compiled


def _launch_all() -> None:
    bf16 = torch.bfloat16
    for out_features, in_features in ((960, 576), (49152, 576), (6144, 4096), (4096, 12288)):
        for dtype in (bf16, torch.float32):
            x = torch.randn(3, in_features).to(dtype)
            matmul.invariant_linear(x, torch.empty(out_features, in_features, dtype=dtype))
    for num_heads, num_kv_heads, head_dim in ((9, 3, 64), (32, 8, 128)):
        for dtype in (bf16, torch.float32):
            q = torch.randn(2, num_heads, head_dim).to(dtype)
            pool = torch.empty(2, 3, 600, num_kv_heads, head_dim, dtype=dtype)
            meta = torch.zeros(2, dtype=torch.int32)
            attention.tree_attention(q, pool[1], pool[1], meta, meta + 1, meta,
                                     torch.zeros(2, 17, dtype=torch.int32), meta, 0.1, 4096)
    for hidden in (576, 4096):
        x = torch.randn(2, hidden).to(bf16)
        rms_norm(x, x[0].clone(), 1e-6, x.clone())
    for num_heads, num_kv_heads, head_dim, norm in ((9, 3, 64, False), (32, 8, 128, True)):
        qkv = torch.randn(2, (num_heads + 2 * num_kv_heads) * head_dim).to(bf16)
        pool = torch.empty(2, 2, 8, num_kv_heads, head_dim, dtype=bf16)
        weight = torch.ones(head_dim, dtype=bf16) if norm else None
        index = torch.zeros(2, dtype=torch.long)
        rope_store(qkv, index, torch.ones(head_dim // 2), pool[0], pool[1], index, index,
                   num_heads, num_kv_heads, weight, weight)
        width = qkv.shape[1]  # RoPE from the QKV GEMM's two split partials
        partials = SplitPartials(torch.randn(2, 2, width), None, bf16)
        rope_store(partials, index, torch.ones(head_dim // 2), pool[0], pool[1], index, index,
                   num_heads, num_kv_heads, weight, weight)
        if not norm:  # RoPE and the KV store as the QKV GEMM's epilogue (the demo target)
            pending = PendingLinear(torch.randn(2, 576).to(bf16),
                                    torch.empty(width, 576, dtype=bf16), None)
            rope_store(pending, index, torch.ones(head_dim // 2), pool[0], pool[1], index,
                       index, num_heads, num_kv_heads)
    silu_mul(torch.randn(2, 2 * 1536).to(bf16))
    for out_features in (960, 3072):  # the demo target's fused prologues
        x = torch.randn(3, 576).to(bf16)
        norm_linear(x, x.clone(), x[0].clone(), 1e-6, torch.empty(out_features, 576, dtype=bf16))
    swiglu_down(torch.randn(3, 2 * 1536).to(bf16), torch.empty(576, 1536, dtype=bf16))
    for hidden, inner in ((576, 1536), (4096, 4096)):  # the norm in a split-K reduce
        linear_norm(torch.randn(3, inner).to(bf16), torch.empty(hidden, inner, dtype=bf16),
                    None, torch.randn(3, hidden).to(bf16), torch.ones(hidden, dtype=bf16), 1e-6)
    for num_nodes in (32, 128):  # the demo drafter's 15 depths, two tree sizes
        logits = torch.randn(2, 15, 49152)
        rows = torch.zeros(2, dtype=torch.long)
        tree_build.tree_from_ranks(logits, logits[..., 0], logits.topk(num_nodes).indices, rows,
                                   _beam_widths(num_nodes, num_nodes, 15), num_nodes, rows,
                                   rows.bool(), rows)
    for vocab, k in ((49152, 16), (151936, 64)):  # the demo and Qwen3 vocabularies
        vocab_topk.topk_logsumexp(torch.randn(2, 15, vocab), k)
    index = torch.zeros(2, dtype=torch.long)  # the draft half's inputs
    draft_prologue.gather_rows(index, torch.zeros(3, 9, dtype=torch.long), (0, 1, 2),
                               torch.empty(3, 16, 2880, dtype=bf16))
    draft_prologue.block_inputs(index, index, index, index, 16, 2,
                                torch.empty(10, 576, dtype=bf16), torch.empty(576, dtype=bf16))
    ints = torch.zeros(3, 9, dtype=torch.long)
    rows = torch.zeros(2, dtype=torch.long)
    for vocab in (49152, 151936):  # the demo and Qwen3 vocabularies: the split argmax
        chunks = round_commit.argmax_chunks(torch.randn(2, vocab))
        round_commit.ar_commit(rows, ints, (0, 1), chunks, torch.zeros(2, 4, dtype=torch.long), 2)
    for num_nodes in (16, 64):  # the verify half's bookkeeping at two tree sizes
        tree = torch.zeros(2, num_nodes + 1, dtype=torch.long)
        *_, chains = round_commit.tree_meta(rows, ints, 0, tree, tree, 16)
        out = torch.zeros(2, 34, dtype=torch.long)
        round_commit.greedy_walk(rows, ints, (0, 1, 4, 8), tree, tree, tree.bool(), tree,
                                 chains, round_commit.argmax_chunks(torch.randn(34, 49152)),
                                 out, torch.empty(2 * (num_nodes + 1), 2880, dtype=bf16),
                                 torch.empty(3, 16, 2880, dtype=bf16), 2)
        round_commit.compact(torch.empty(30, 3, 64, 3, 64, dtype=bf16),
                             torch.empty(30, 3, 64, 3, 64, dtype=bf16), rows,
                             tree.view(-1), out, 16, 2)


def sass_of(kernel: object) -> tuple[str, str]:
    """(resource usage line, SASS) of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([CUOBJDUMP, "--dump-sass", cubin.name], capture_output=True,
                              text=True, check=True).stdout
    line = next(row for row in usage.splitlines() if "REG:" in row)
    return " ".join(line.split()[:5]), sass


def loop_float_ops(sass: str) -> list[collections.Counter]:
    """The float-op multiset of each loop (a backward branch's span) in a SASS listing."""
    code = [(int(addr, 16), text) for addr, text in
            re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = [(int(target, 16), addr) for addr, text in code
             for target in re.findall(r"BRA\s+0x([0-9a-f]+)", text) if int(target, 16) < addr]
    return [collections.Counter(op.group(0) for addr, text in code if low <= addr <= high
                                for op in [FLOAT_OP.search(text)] if op)
            for low, high in loops]


MEMORY_OP = re.compile(r"^\s*(ld|st|atom|red)\.global", re.MULTILINE)


def pdl_report(pdl: bool) -> list[dict[str, object]]:
    """Compiles every launcher with dependent launches forced on or off; per kernel: the
    launch flag, how many grid-dependency waits / launch_dependents the PTX holds,
    whether the wait precedes the first global memory access (else how many global loads
    and writes come before it), and whether an L2 prefetch
    (the GEMMs' weights, tree attention's prefix K/V) precedes the wait."""
    modules = (matmul, rmsnorm_module, rope_module, swiglu_module, attention, tree_build,
               round_commit, vocab_topk, draft_prologue)
    saved = [module.use_pdl for module in modules]
    for module in modules:
        module.use_pdl = lambda tensor: pdl  # type: ignore[assignment]
    try:
        compiled = compile_everything()
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.use_pdl = original  # type: ignore[assignment]
    report = []
    for name, kernel in compiled:
        ptx = kernel.asm["ptx"]  # type: ignore[attr-defined]
        first_access = MEMORY_OP.search(ptx)
        wait = ptx.find("griddepcontrol.wait")
        before = [op.group(1) for op in MEMORY_OP.finditer(ptx[:max(wait, 0)])]
        report.append({
            "kernel": name, "launch_pdl": bool(kernel.metadata.launch_pdl),  # type: ignore[attr-defined]
            "waits": ptx.count("griddepcontrol.wait"),
            "launch_dependents": ptx.count("griddepcontrol.launch_dependents"),
            "wait_before_memory": wait >= 0 and (first_access is None
                                                 or wait < first_access.start()),
            "loads_before_wait": before.count("ld"),
            "writes_before_wait": len(before) - before.count("ld"),
            "wait_before_launch": 0 <= wait < ptx.find("griddepcontrol.launch_dependents"),
            "prefetch_before_wait": 0 <= ptx.find("prefetch.global.L2") < wait,
        })
    return report


# (Hq, Hkv, D) x (BLOCK_N, warps, stages): the production tiles of both head dims, and the
# settings lease 15 measured
LOOP_CASES = [((9, 3, 64), attention.ATTN_TILES[64]), ((32, 8, 128), attention.ATTN_TILES[128]),
              ((32, 8, 128), (64, 4, 2)), ((9, 3, 64), (64, 4, 3)), ((32, 8, 128), (64, 8, 3))]


def _grouped(kernel: object) -> bool:
    """Whether a compiled tree-attention split kernel has query groups (QUERY_GROUP > 1)."""
    names = attention._tree_attention_split_kernel.arg_names  # type: ignore[attr-defined]
    return kernel.src.constants[(names.index("QUERY_GROUP"),)] > 1  # type: ignore[attr-defined]


def attention_loops_report() -> list[dict[str, object]]:
    """Per case: whether the split kernel's key loops compile to the same float
    operations (`tree_attention.split_loops_agree` on the PTX: multisets)."""
    report: list[dict[str, object]] = []

    def launch() -> None:
        for (num_heads, num_kv_heads, head_dim), (block, warps, stages) in LOOP_CASES:
            q = torch.randn(3, num_heads, head_dim).to(torch.bfloat16)
            cache = torch.zeros(2, 600, num_kv_heads, head_dim, dtype=torch.bfloat16)
            meta = torch.zeros(3, dtype=torch.int64)
            try:  # the runtime guard refuses the kernels whose loops differ: compiled anyway
                attention.tree_attention_tiled(
                    q, cache, cache, meta, meta + 300, meta + 300,
                    torch.zeros(3, 2, dtype=torch.int64), meta + 1, 0.1, 600, block,
                    attention.SPLIT_SIZE, True, warps, stages)
            except RuntimeError:
                pass

    global _launch_all
    saved, _launch_all = _launch_all, launch
    try:  # the launches' own kernels (with query groups), not the twins the checks compile
        compiled = [kernel for name, kernel in compile_everything()
                    if name == "_tree_attention_split_kernel" and _grouped(kernel)]
    finally:
        _launch_all = saved
    for ((_, _, head_dim), tiles), kernel in zip(LOOP_CASES, compiled, strict=True):
        report.append({"head_dim": head_dim, "tiles": list(tiles),
                       "agree": attention.split_loops_agree(kernel.asm["ptx"])})  # type: ignore[attr-defined]
    return report


def attention_stages_report() -> list[dict[str, object]]:
    """Per head dim with WIDE_STAGES and per dtype, the split kernel as the engine launches
    it: with query groups at the head dim's ATTN_TILES stages and at its wide-launch
    stages, and without groups (decoding) at the tile's stages. Whether the wide variant's
    float operations are the narrow one's (`tree_attention.stages_agree`: the whole PTX, in
    order) and whether the grouped variants' key loops are the ungrouped one's
    (`split_loops_agree` across variants); the registers and shared memory of each."""
    cases = [(shape, dtype) for shape in ((9, 3, 64), (32, 8, 128))
             if shape[2] in attention.WIDE_STAGES for dtype in (torch.bfloat16, torch.float32)]
    report: list[dict[str, object]] = []
    global _launch_all
    saved = _launch_all
    try:
        for (num_heads, num_kv_heads, head_dim), dtype in cases:
            block, warps, stages = attention.ATTN_TILES[head_dim]
            wide = attention.WIDE_STAGES[head_dim]

            def launch(num_heads: int = num_heads, num_kv_heads: int = num_kv_heads,
                       head_dim: int = head_dim, dtype: torch.dtype = dtype,
                       block: int = block, warps: int = warps, stages: int = stages,
                       wide: int = wide) -> None:
                q = torch.randn(3, num_heads, head_dim).to(dtype)
                cache = torch.zeros(2, 600, num_kv_heads, head_dim, dtype=dtype)
                meta = torch.zeros(3, dtype=torch.int64)
                for launch_stages, group in ((stages, 1), (stages, None), (wide, None)):
                    # as the engine launches them (the runtime checks compile the twins)
                    attention.tree_attention_tiled(
                        q, cache, cache, meta, meta + 300, meta + 300,
                        torch.zeros(3, 2, dtype=torch.int64), meta + 1, 0.1, 600, block,
                        attention.SPLIT_SIZE, True, warps, launch_stages, twin_stages=stages,
                        query_group=group)

            _launch_all = launch
            kernels = [kernel for name, kernel in compile_everything()
                       if name == "_tree_attention_split_kernel"]

            def find(num_stages: int, grouped: bool, kernels: list = kernels) -> object:
                return next(k for k in kernels if k.metadata.num_stages == num_stages
                            and _grouped(k) == grouped)

            ungrouped, committed, wide_kernel = (find(stages, False), find(stages, True),
                                                 find(wide, True))
            ptx = [k.asm["ptx"] for k in (ungrouped, committed, wide_kernel)]  # type: ignore[attr-defined]
            report.append({
                "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."),
                "stages": [stages, wide],
                "agree": attention.stages_agree(ptx[2], ptx[1]),
                "groups_agree": attention.split_loops_agree(ptx[1], ptx[0], ptx[2]),
                "usage": [sass_of(k)[0] for k in (committed, wide_kernel, ungrouped)],
                "shared": [k.metadata.shared for k in (committed, wide_kernel)]})  # type: ignore[attr-defined]
    finally:
        _launch_all = saved
    return report


def main() -> None:
    if sys.argv[1:2] == ["--pdl"]:
        print(json.dumps(pdl_report(sys.argv[2] == "on")))
        return
    if sys.argv[1:2] == ["--attention-loops"]:
        print(json.dumps(attention_loops_report()))
        return
    if sys.argv[1:2] == ["--attention-stages"]:
        print(json.dumps(attention_stages_report()))
        return
    if sys.argv[1:2] == ["--attention"]:  # both, in one process (the CI test's time)
        print(json.dumps({"loops": attention_loops_report(),
                          "stages": attention_stages_report()}))
        return
    print(f"triton {triton.__version__}, target sm_90")
    for name, kernel in compile_everything():
        usage, sass = sass_of(kernel)
        mma = "HGMMA" if "HGMMA" in sass else "HMMA" if "HMMA" in sass else "no MMA"
        line = f"{name:32s} {usage:42s} {mma:7s} shared {kernel.metadata.shared:6d} B"
        if name == "_tree_attention_split_kernel":
            loops = loop_float_ops(sass)
            line += f"  loops {len(loops)}, same float ops: {len(set(map(str, loops))) == 1}"
        print(line)


if __name__ == "__main__":
    main()
