"""Benchmark: the drafter's vocabulary top-K, the Triton kernels (bitonic selection, and
K max-reduction rounds: " rounds") against `_stable_topk` (torch.topk over int64 keys), at
the demo drafter's 15 depths and the demo / Qwen3 vocabularies, batch 1 and 8, the
policy's tree sizes."""

from __future__ import annotations

import torch

from ddtree.kernels.vocab_topk import stable_topk
from ddtree.tree import _stable_topk
from tests.kernels.timing import compare, floor_us

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


if __name__ == "__main__":
    for row in bench_vocab_topk(torch.device("cuda")):
        print(row)
