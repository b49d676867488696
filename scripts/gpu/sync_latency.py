"""A CUDA graph's replay + the round's host copy + an event wait, timed per iteration: what
one engine step's launch-and-wait costs on the host apart from the work (run as an MPS
client and without: lease 44, call 152)."""

from __future__ import annotations

import sys
import time

import torch


def main() -> int:
    device = torch.device("cuda")
    x = torch.randn(8, 576, device=device)
    w = torch.randn(576, 576, device=device)
    host = torch.empty(8, 576, pin_memory=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            y = x @ w
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(30):  # 60 small kernels (30 GEMM + tanh pairs)
            y = torch.tanh(y @ w)
    for label, kernels in (("graph", True), ("copy only", False)):
        times = []
        for _ in range(2000):
            started = time.perf_counter()
            if kernels:
                graph.replay()
            host.copy_(y, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            times.append(time.perf_counter() - started)
        times.sort()
        print(f"{label}: median {1e6 * times[len(times) // 2]:.1f} us, p90 "
              f"{1e6 * times[int(len(times) * 0.9)]:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
