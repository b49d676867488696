"""Benchmark: the drafter's vocabulary top-K, the Triton kernels (bitonic selection, and
K max-reduction rounds: " rounds") against `_stable_topk` (torch.topk over int64 keys), at
the demo drafter's 15 depths and the demo / Qwen3 vocabularies, batch 1 and 8, the
policy's tree sizes."""

from __future__ import annotations

import torch

from ddtree.kernels.vocab_topk import stable_topk
from ddtree.tree import _stable_topk
from tests.kernels.timing import compare, floor_us, measure

VOCABS = {"smollm2": 49152, "qwen3": 151936}
BATCHES = (1, 8)
KS = (16, 32, 63)
DEPTHS = 15


def bench_vocab_topk(device: torch.device, vocabs: dict[str, int] = VOCABS,
                     batches: tuple[int, ...] = BATCHES, ks: tuple[int, ...] = KS,
                     selections: tuple[tuple[str, bool | None], ...] = (
                         ("", True), (" rounds", False))) -> list[dict]:
    rows = []
    for name, vocab in vocabs.items():
        for batch in batches:
            logp = torch.randn(batch, DEPTHS, vocab, device=device).log_softmax(-1)
            for k in ks:
                for label, bitonic in selections:
                    times = compare(lambda x=logp, k=k, b=bitonic: stable_topk(x, k, b),
                                    lambda x=logp, k=k: _stable_topk(x, k), device)
                    rows.append({"kernel": "vocab_topk", "case": f"{name} V={vocab} K={k}{label}",
                                 "T": batch * DEPTHS, "floor_us": floor_us(logp.numel() * 4),
                                 **times})
    return rows


def sweep_shapes(device: torch.device, shapes: list[tuple[int, int, int]],
                 cases: tuple[tuple[str, int, int], ...] = (
                     ("smollm2", 49152, 16), ("smollm2", 49152, 32), ("qwen3", 151936, 63)),
                 batches: tuple[int, ...] = (1, 8)) -> list[dict]:
    """The tournament's shapes, (leaf chunk, leaf warps, merge warps) each, at the demo's
    and the 8B's vocabularies and tree sizes (graph replay, us); every shape's tokens
    against the first shape's (they must be the same)."""
    rows = []
    for name, vocab, k in cases:
        for batch in batches:
            logp = torch.randn(batch, DEPTHS, vocab, device=device).log_softmax(-1)
            want = stable_topk(logp, k)
            for chunk, leaf_warps, merge_warps in shapes:
                def run(x=logp, k=k, c=chunk, w=(leaf_warps, merge_warps)):  # noqa: ANN001
                    return stable_topk(x, k, leaf_chunk=c, warps=w)
                same = bool(torch.equal(run(), want))
                times = measure(run, device)
                rows.append({"case": f"{name} V={vocab} K={k}", "T": batch * DEPTHS,
                             "shape": f"{chunk}/{leaf_warps}/{merge_warps}", "same": same,
                             **times})
                print(f"{rows[-1]['case']:>24} T={batch * DEPTHS:>3} leaf {chunk:>5} "
                      f"warps {leaf_warps}/{merge_warps}: {times['graph_us']:8.2f} us "
                      f"(do_bench {times['bench_us']:8.2f})  same {same}", flush=True)
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="",
                        help="leaf chunk/leaf warps/merge warps, comma-separated (e.g. "
                             "512/1/1,512/1/4,2048/4/4): the tournament's shapes side by side")
    options = parser.parse_args()
    if options.shapes:
        sweep_shapes(torch.device("cuda"), [tuple(int(v) for v in shape.split("/"))
                                            for shape in options.shapes.split(",")])
    else:
        for row in bench_vocab_topk(torch.device("cuda")):
            print(row)
