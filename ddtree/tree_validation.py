"""Checks of draft trees that come from outside (a Verify client, the drafter service):
`validate_tree` names the first offending node of any malformed tree, `invalid_rows` /
`check_rows` every malformed row of a padded batch of trees (the drafter's reply to a
round; a few array ops screen all rows, only the flagged ones are diagnosed node by node).
Vectorised: one sort of (parent, token) keys finds twin siblings, pointer doubling finds
depths."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from ddtree.errors import TreeValidationError

_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def validate_tree(
    tokens: Tensor, parents: Tensor, vocab_size: int, max_nodes: int,
    max_depth: int | None = None,
) -> None:
    """Checks a tree from outside: tokens, parents (1+N,) or (B, 1+N), integer dtypes.

    Raises TreeValidationError naming the offending node: N > max_nodes, a root whose
    parent is not -1, parents[i] not in [0, i) (this also rules out cycles), a token
    outside [0, vocab_size), two siblings with the same token, a depth above max_depth.
    Synchronises with the host: meant for small trees from the wire.
    """
    _check_layout(tokens, parents, max_nodes)
    label = _row_label if tokens.dim() == 2 else _tree_label
    num_rows = tokens.shape[-1]
    tokens_np = tokens.reshape(-1, num_rows).long().cpu().numpy()  # (B, 1+N)
    parents_np = parents.reshape(-1, num_rows).long().cpu().numpy()
    real = np.ones(tokens_np.shape, dtype=bool)
    for bad, message in _node_checks(tokens_np, parents_np, real, vocab_size, max_depth):
        _fail_at(bad, label, message)


@dataclass
class CheckedRows:
    """`check_rows`' verdict on a padded batch of trees (B, W): problems {row: why} of the
    malformed rows; for every other row, real (B, W) its real nodes, parents (B, W) int64
    with the padding under the root (parents[:, 0] = -1) and depth (B, W) int64 (the
    padding at depth 1). Malformed rows' values of real / parents / depth are meaningless."""

    problems: dict[int, str]
    real: np.ndarray
    parents: np.ndarray
    depth: np.ndarray


def invalid_rows(
    tokens: ArrayLike, parents: ArrayLike, num_nodes: ArrayLike, vocab_size: int,
    max_depth: int,
) -> dict[int, str]:
    """The rows of a batch of trees from outside that are malformed, with why.

    tokens, parents: (B, W) integers on the CPU (numpy or torch); row b's tree is its first
    num_nodes[b] (B,) nodes (1 <= num_nodes[b] <= W, the caller's check), the rest padding.
    The same checks and words as `validate_tree`, for all rows at once: a row's first
    problem names its first offending node; -> {row: problem} (empty when every tree is
    well formed)."""
    return check_rows(tokens, parents, num_nodes, vocab_size, max_depth).problems


def check_rows(
    tokens: ArrayLike, parents: ArrayLike, num_nodes: ArrayLike, vocab_size: int,
    max_depth: int,
) -> CheckedRows:
    """`invalid_rows` plus what a caller places the good rows with (their depths). Rows are
    screened together with a few array ops; only the rows that fail the screen (rare: a
    drafter never sends one) go through `_node_checks` for their diagnosis. The screen
    flags exactly the rows `_node_checks` would: the same conditions, and twins found as
    equal (parent, token) keys among the real nodes."""
    tokens_np = np.asarray(tokens, dtype=np.int64)
    parents_np = np.asarray(parents, dtype=np.int64)
    index = np.arange(tokens_np.shape[1])
    real = index < np.asarray(num_nodes)[:, None]  # (B, W)
    safe_parents = np.where(real, parents_np, 0)  # the padding under the root
    safe_parents[:, 0] = -1  # the root's own parent is checked on parents_np
    misplaced = (safe_parents < 0) | (safe_parents >= index)  # real nodes only, root aside
    misplaced[:, 0] = False
    out_of_vocab = ((tokens_np < 0) | (tokens_np >= vocab_size)) & real
    bad = (parents_np[:, 0] != -1) | (misplaced | out_of_vocab).any(axis=1)
    safe_parents[misplaced] = 0
    # Padding keys lie below every real key (a root's is token - vocab_size >= -vocab_size).
    key = np.where(real, safe_parents * vocab_size + tokens_np, -vocab_size - 1 - index)
    key.sort(axis=1)
    bad |= (key[:, 1:] == key[:, :-1]).any(axis=1)
    depth = host_depths(safe_parents, max_depth)
    bad |= ((depth > max_depth) & real).any(axis=1)
    problems: dict[int, str] = {}
    if bad.any():
        flagged = np.flatnonzero(bad)
        found = _diagnose(tokens_np[flagged], parents_np[flagged], real[flagged], vocab_size,
                          max_depth)
        problems = {int(flagged[j]): problem for j, problem in found.items()}
    return CheckedRows(problems, real, safe_parents, depth)


def _diagnose(
    tokens: np.ndarray, parents: np.ndarray, real: np.ndarray, vocab_size: int, max_depth: int,
) -> dict[int, str]:
    """{row: its first problem} of (B, W) rows, through every check in order."""
    problems: dict[int, str] = {}
    for bad, message in _node_checks(tokens, parents, real, vocab_size, max_depth):
        bad_rows = bad.any(axis=1)
        if not bad_rows.any():
            continue
        first = bad.argmax(axis=1)  # (B,) the first offending node of each row
        for b in np.flatnonzero(bad_rows).tolist():
            if b not in problems:
                problems[b] = "tree: " + message(b, int(first[b]))
    return problems


def _node_checks(
    tokens: np.ndarray, parents: np.ndarray, real: np.ndarray, vocab_size: int,
    max_depth: int | None,
) -> Iterator[tuple[np.ndarray, Callable[[int, int], str]]]:
    """(bad (B, W) bool, message(row, node)) of each check, in order, over the real nodes
    (real (B, W) masks padding). A check sees the offenders of earlier checks (and the
    padding) replaced by harmless values, so each is well defined on any input; a row's
    first failing check is its diagnosis. numpy: these arrays are small and on the host,
    where a numpy op costs a fraction of a torch op's dispatch."""
    index = np.arange(tokens.shape[1])
    yield (index == 0) & (parents != -1), lambda b, i: (
        f"parents[0] = {int(parents[b, 0])} must be -1 (node 0 is the root)")
    misplaced = ((parents < 0) | (parents >= index)) & (index > 0) & real
    yield misplaced, lambda b, i: (
        f"parents[{i}] = {int(parents[b, i])} must be a node before {i} "
        "(0 <= parents[i] < i; this also rules out cycles)")
    safe_parents = np.where(misplaced | ~real, 0, parents)
    safe_parents[:, 0] = -1
    out_of_vocab = ((tokens < 0) | (tokens >= vocab_size)) & real
    yield out_of_vocab, lambda b, i: (
        f"tokens[{i}] = {int(tokens[b, i])} is outside the vocabulary [0, {vocab_size})")
    safe_tokens = np.where(out_of_vocab | ~real, 0, tokens)
    # Padding comes after every real node, so it is never a real node's earlier twin.
    twin = _earlier_twin(safe_tokens, safe_parents, vocab_size)  # (B, W): -1 or a twin
    yield (twin >= 0) & real, lambda b, i: (
        f"nodes {int(twin[b, i])} and {i} are siblings with the same token {int(tokens[b, i])}")
    if max_depth is not None:
        depth = host_depths(safe_parents)
        yield (depth > max_depth) & real, lambda b, i: (
            f"node {i} has depth {int(depth[b, i])} > max_depth {max_depth}")


def _earlier_twin(tokens: np.ndarray, parents: np.ndarray, vocab_size: int) -> np.ndarray:
    """(B, 1+N) int64: for each node, the earliest sibling with the same token, or -1.
    One stable sort of (parent, token) keys: O(N log N), no N x N table."""
    key = parents.clip(min=-1) * vocab_size + tokens  # parents and tokens checked first
    rows = np.arange(key.shape[0])[:, None]
    order = np.argsort(key, axis=1, kind="stable")  # (B, 1+N), equal keys by index
    sorted_key = key[rows, order]
    same = np.zeros(key.shape, dtype=bool)
    same[:, 1:] = sorted_key[:, 1:] == sorted_key[:, :-1]
    # The first of each run of equal keys: the run's earliest node.
    run_start = np.maximum.accumulate(np.where(same, 0, np.arange(key.shape[1])), axis=1)
    twin = np.empty_like(key)
    twin[rows, order] = np.where(same, order[rows, run_start], -1)
    return twin


def host_depths(parents: np.ndarray, max_depth: int | None = None) -> np.ndarray:
    """(B, 1+N) depth of topologically ordered trees (ddtree.tree.depths_from_parents in
    numpy): pointer doubling on the flattened batch (a flat gather costs less than a
    (rows, hop) one). With `max_depth`, only the rounds that settle depths up to it: after
    k rounds a node deeper than 2**k reads 2**k, so k = max_depth.bit_length() rounds
    give every depth <= max_depth exactly and every deeper one as > max_depth."""
    num_rows, width = parents.shape
    num_rounds = (width - 1).bit_length()
    if max_depth is not None:
        num_rounds = min(num_rounds, max(max_depth, 0).bit_length())
    depth = (parents >= 0).astype(np.int64).ravel()  # (B * (1+N),)
    hop = (parents.clip(min=0) + width * np.arange(num_rows)[:, None]).ravel()
    for _ in range(num_rounds):
        depth, hop = depth + depth[hop], hop[hop]
    return depth.reshape(num_rows, width)


def _check_layout(tokens: Tensor, parents: Tensor, max_nodes: int) -> None:
    """Types, dtypes, matching shapes and the node count."""
    for name, value in (("tokens", tokens), ("parents", parents)):
        if not isinstance(value, Tensor):
            raise TreeValidationError(f"tree: {name} must be a tensor, got {type(value).__name__}")
        if value.dtype not in _INTEGER_DTYPES:
            raise TreeValidationError(f"tree: {name} must have an integer dtype, got {value.dtype}")
        if value.dim() not in (1, 2) or value.shape[-1] < 1 or value.numel() == 0:
            raise TreeValidationError(
                f"tree: {name} has shape {list(value.shape)}, expected [1+N] or [B, 1+N]"
            )
    if tokens.shape != parents.shape:
        raise TreeValidationError(
            f"tree: tokens shape {list(tokens.shape)} != parents shape {list(parents.shape)}"
        )
    if tokens.shape[-1] - 1 > max_nodes:
        raise TreeValidationError(
            f"tree: {tokens.shape[-1] - 1} nodes besides the root exceed max_nodes {max_nodes}"
        )


def _row_label(row: int) -> str:
    return f"tree row {row}: "


def _tree_label(row: int) -> str:
    return "tree: "


def _fail_at(
    bad: np.ndarray, label: Callable[[int], str], message: Callable[[int, int], str]
) -> None:
    """Raises TreeValidationError for the first True of bad (B, 1+N), row-major; message
    gets (row, node)."""
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        raise TreeValidationError(label(b) + message(b, i))
