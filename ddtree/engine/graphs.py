"""CUDA graphs per static shape: a round's device work is captured once per bucket key and
replayed, so a round costs a handful of launches instead of ~1,800 eager ops.

The functions captured here read and write only tensors whose addresses never change (the
engine's pool, per-slot state and per-bucket buffers) and make no host sync. On the CPU
(or with graphs off) `run` simply calls the function.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

# Untimed runs before a capture: the first compiles Triton kernels and fills caches, the
# second runs on warm allocator state (what torch recommends before capturing).
WARMUP_RUNS = 2


class GraphRunner:
    """key -> captured graph and its outputs; all graphs share one memory pool (they are
    replayed one at a time, and their outputs stay alive, so no output is ever reused as
    another graph's scratch)."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.enabled = enabled and device.type == "cuda"
        self.device = device
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.enabled else None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def capture(self, key: Hashable, fn: Callable[[], Any]) -> None:
        """Warms `fn` up and captures it under `key`. The caller points fn's inputs at
        scratch rows first: warm-up runs really execute."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = fn()
        self._graphs[key] = (graph, outputs)

    def run(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        """Replays the graph captured under `key` (the caller captured it first), or calls
        fn when graphs are off."""
        if not self.enabled:
            return fn()
        graph, outputs = self._graphs[key]
        graph.replay()
        return outputs
