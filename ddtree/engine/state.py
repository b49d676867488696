"""Per pool row state on the device, and the slot allocator.

Everything a round needs about a row lives in device tensors indexed by its pool slot, so
a round reads it with one gather by `rows` and writes it back with one scatter: the host
sends nothing per round but the row list. Slot `num_slots` is the scratch row that
padding rows of a batch bucket point at (its writes land nowhere that matters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.engine.request import MODE_RULES, GenerationRequest
from ddtree.sampling import RowSampling, seed_to_int64

# Columns of the int64 table.
COMMITTED, BONUS, BUDGET, FORCE_CHAIN, FIRST_CHILD, MAX_TOPK, TOP_K, SEED, PENDING = range(9)
# Columns of the float32 table.
TEMPERATURE, TOP_P = range(2)


@dataclass(frozen=True)
class RowParams:
    """What a row's rounds read from the tables besides its lengths."""

    budget: int  # tree nodes per round besides the root (0: an ar row)
    force_chain: bool
    first_child_only: bool
    max_topk: int  # 0: no cap
    temperature: float
    top_k: int
    top_p: float
    seed: int

    @classmethod
    def of(cls, request: GenerationRequest, num_nodes: int, seed: int) -> RowParams:
        rule = MODE_RULES[request.spec.mode]
        s = request.sampling
        return cls(num_nodes, rule.force_chain, rule.first_child_only,
                   request.spec.max_topk or 0, s.temperature, s.top_k, s.top_p, seed)


class SlotState:
    """ints: (num_slots + 1, 9) int64; floats: (num_slots + 1, 2) float32; pending:
    (num_slots + 1, b, k*H) the target features of the rows committed by a row's last
    round, not yet in the drafter's context (None without feature layers)."""

    def __init__(self, num_slots: int, block_size: int, feature_width: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        rows = num_slots + 1
        self.num_slots = num_slots
        self.ints = torch.zeros(rows, 9, dtype=torch.long, device=device)
        self.floats = torch.zeros(rows, 2, dtype=torch.float32, device=device)
        self.floats[:, TOP_P] = 1.0
        self.pending = (torch.zeros(rows, block_size, feature_width, device=device, dtype=dtype)
                        if feature_width else None)

    @classmethod
    def over(cls, ints: Tensor, pending: Tensor | None) -> SlotState:
        """The state of another process's engine, over its tables opened here (the shared
        draft link: what the draft half reads)."""
        state = cls.__new__(cls)
        state.num_slots = ints.shape[0] - 1
        state.ints, state.pending = ints, pending
        state.floats = torch.zeros(ints.shape[0], 2, dtype=torch.float32, device=ints.device)
        return state

    @property
    def scratch(self) -> int:
        return self.num_slots

    def start_row(self, slot: int, committed_len: int, bonus: Tensor, params: RowParams) -> None:
        """A row after its prefill; bonus: (1,) int64 on the device (no host sync)."""
        ints = torch.tensor([committed_len, 0, params.budget, params.force_chain,
                             params.first_child_only, params.max_topk, params.top_k,
                             seed_to_int64(params.seed), 0], dtype=torch.long)
        self.ints[slot] = ints.to(self.ints.device, non_blocking=True)
        self.ints[slot, BONUS] = bonus[0]
        floats = torch.tensor([params.temperature, params.top_p], dtype=torch.float32)
        self.floats[slot] = floats.to(self.floats.device, non_blocking=True)

    def set_tree_shape(self, slot: int, budget: int, force_chain: bool) -> None:
        """An auto row's tree for its next rounds (the walk stays the full tree walk)."""
        self.ints[slot, BUDGET] = budget
        self.ints[slot, FORCE_CHAIN] = int(force_chain)

    def column(self, rows: Tensor, column: int) -> Tensor:
        return self.ints[rows, column]

    def sampling(self, rows: Tensor, any_sampled: bool, any_filtered: bool) -> RowSampling:
        return RowSampling(
            temperature=self.floats[rows, TEMPERATURE], top_k=self.ints[rows, TOP_K],
            top_p=self.floats[rows, TOP_P], seed=self.ints[rows, SEED],
            any_sampled=any_sampled, any_filtered=any_filtered)

    def reset_scratch(self) -> None:
        """Padding rows advanced the scratch row's length: put it back at 0 (a kernel, no
        host value: this runs inside captured graphs)."""
        self.ints[self.scratch].zero_()


class SlotAllocator:
    """Free pool rows, lowest first (deterministic placement)."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def allocate(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        assert slot not in self._free, f"slot {slot} freed twice"
        self._free.append(slot)
        self._free.sort(reverse=True)
