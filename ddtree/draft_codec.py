"""Wire codec of the Draft stream's batched messages (wire versions 2-3, drafter.proto):
DraftBatch (a round's rows: all features in one tensor) and DraftTrees (all trees in two
tensors) <-> host tensors. `ddtree/codec.py`'s companion for the drafter link, with its
rules: raw little-endian tensors, decoding is one copy per tensor, never a loop over rows
or nodes; what arrives is checked before it is trusted (InvalidArgumentError for a
malformed batch, TreeValidationError for malformed trees).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ddtree import codec
from ddtree.engine import SpecParams
from ddtree.errors import InvalidArgumentError, TreeValidationError
from ddtree.v1 import common_pb2, drafter_pb2, tensor_pb2

# What DrafterInfo.wire_version says this code speaks (see drafter.proto).
DRAFT_WIRE_VERSION = 3


@dataclass
class DraftRound:
    """A DraftBatch's R rows, decoded. committed_len, bonus_token, num_features: (R,)
    int64; features: (sum C, k*H) floating point, row r's C_r rows after those of the
    rows before it; specs: row index -> the spec of a row whose session opens;
    num_nodes (R,) int64 and force_chain (R,) bool: this round's tree of each row (None:
    each session's spec decides)."""

    session_ids: list[str]
    committed_len: np.ndarray
    bonus_token: np.ndarray
    num_features: np.ndarray
    features: Tensor
    specs: Mapping[int, common_pb2.SpecParams]
    num_nodes: np.ndarray | None = None
    force_chain: np.ndarray | None = None

    @functools.cached_property
    def feature_starts(self) -> np.ndarray:
        """(R,) the first feature row of each row."""
        return np.cumsum(self.num_features) - self.num_features


def draft_batch_to_proto(session_ids: Sequence[str], committed_len: Sequence[int],
                         bonus_token: Sequence[int], features: Tensor,
                         num_features: Sequence[int], specs: Mapping[int, SpecParams],
                         out: drafter_pb2.DraftBatch | None = None,
                         num_nodes: Sequence[int] = (),
                         force_chain: Sequence[bool] = ()) -> drafter_pb2.DraftBatch:
    """features: (sum C, k*H), num_features (R,) rows of it per row, in row order;
    num_nodes / force_chain: (R,) each row's tree this round, or both empty. Written into
    `out` when given (an empty DraftBatch, e.g. a DraftRequest's `batch`): building the
    message where it is sent saves copying the features into it (upb copies a
    submessage on assignment)."""
    assert features.dim() == 2 and features.shape[0] == sum(num_features), features.shape
    assert len(num_nodes) == len(force_chain) in (0, len(session_ids)), (num_nodes, force_chain)
    msg = drafter_pb2.DraftBatch() if out is None else out
    msg.session_ids.extend(session_ids)
    msg.committed_len.extend(committed_len)
    msg.bonus_token.extend(bonus_token)
    msg.num_features.extend(num_features)
    msg.num_nodes.extend(num_nodes)
    msg.force_chain.extend(force_chain)
    codec.tensor_to_proto(features, out=msg.features)
    for row, spec in specs.items():
        codec.spec_to_proto(spec, out=msg.specs[row])
    return msg


def draft_round_from_proto(msg: drafter_pb2.DraftBatch, feature_width: int) -> DraftRound:
    """Checks what concerns the whole batch (lengths, the features' shape and dtype);
    the checks of single rows are the drafter's."""
    num_rows = len(msg.session_ids)
    if not len(msg.committed_len) == len(msg.bonus_token) == len(msg.num_features) == num_rows:
        raise InvalidArgumentError(
            f"batch: {num_rows} session_ids, but committed_len / bonus_token / num_features "
            f"have {len(msg.committed_len)} / {len(msg.bonus_token)} / {len(msg.num_features)}")
    num_features = np.fromiter(msg.num_features, np.int64, num_rows)
    if num_rows and num_features.min() < 0:
        raise InvalidArgumentError("batch: num_features must be >= 0")
    features = codec.tensor_from_proto(msg.features, "batch.features", ndim=2)
    total = int(num_features.sum())
    if features.shape[0] != total or features.shape[1] != feature_width:
        raise InvalidArgumentError(
            f"batch.features: shape {list(features.shape)}, expected "
            f"[{total}, {feature_width}] (the rows' num_features, k*H)")
    if not features.is_floating_point():
        raise InvalidArgumentError(f"batch.features: dtype {features.dtype} is not floating point")
    specs = dict(msg.specs) if msg.specs else {}
    bad = [row for row in specs if not 0 <= row < num_rows]
    if bad:
        raise InvalidArgumentError(f"batch.specs: rows {bad} outside [0, {num_rows})")
    num_nodes = force_chain = None
    if msg.num_nodes or msg.force_chain:
        if not len(msg.num_nodes) == len(msg.force_chain) == num_rows:
            raise InvalidArgumentError(
                f"batch: {num_rows} session_ids, but num_nodes / force_chain have "
                f"{len(msg.num_nodes)} / {len(msg.force_chain)} (both empty or one per row)")
        num_nodes = np.fromiter(msg.num_nodes, np.int64, num_rows)
        force_chain = np.fromiter(msg.force_chain, np.bool_, num_rows)
    return DraftRound(list(msg.session_ids), np.fromiter(msg.committed_len, np.int64, num_rows),
                      np.fromiter(msg.bonus_token, np.int64, num_rows), num_features, features,
                      specs, num_nodes, force_chain)


@dataclass
class DraftedTrees:
    """A round's trees, row r's the first num_nodes[r] nodes of tokens / parents (R, W)
    int64 (num_nodes 0: failed, see errors); committed_len (R,) echoed; errors: row ->
    (message, grpc status code name). Host arrays (numpy) on both sides of the wire."""

    tokens: np.ndarray
    parents: np.ndarray
    num_nodes: np.ndarray
    committed_len: np.ndarray
    errors: dict[int, tuple[str, str]]


def draft_trees_to_proto(trees: DraftedTrees,
                         out: drafter_pb2.DraftTrees | None = None) -> drafter_pb2.DraftTrees:
    """The trees trimmed to the largest one, as int32; written into `out` when given (a
    DraftResponse's `trees`, see draft_batch_to_proto)."""
    msg = drafter_pb2.DraftTrees() if out is None else out
    width = max(1, int(trees.num_nodes.max(initial=0)))
    codec.array_to_proto(trees.tokens[:, :width].astype(np.int32), out=msg.tokens)
    codec.array_to_proto(trees.parents[:, :width].astype(np.int32), out=msg.parents)
    msg.num_nodes.extend(trees.num_nodes.tolist())
    msg.committed_len.extend(trees.committed_len.tolist())
    for row, (error, code) in sorted(trees.errors.items()):
        msg.errors.add(row=row, error=error, error_code=code)
    return msg


def draft_trees_from_proto(msg: drafter_pb2.DraftTrees, num_rows: int,
                           max_width: int) -> DraftedTrees:
    """The reply to a batch of `num_rows` rows; trees of at most `max_width` nodes (the
    root included). Checks shapes and counts; the trees themselves are
    `tree_validation.check_rows`' to check."""
    if len(msg.num_nodes) != num_rows or len(msg.committed_len) != num_rows:
        raise TreeValidationError(
            f"trees: {len(msg.num_nodes)} num_nodes and {len(msg.committed_len)} committed_len "
            f"for a batch of {num_rows} rows")
    num_nodes = np.fromiter(msg.num_nodes, np.int64, num_rows)
    committed = np.fromiter(msg.committed_len, np.int64, num_rows)
    tokens, parents = (_tree_array(msg.tokens, "tokens", num_rows, max_width),
                       _tree_array(msg.parents, "parents", num_rows, max_width))
    if tokens.shape != parents.shape:
        raise TreeValidationError(
            f"trees: tokens shape {list(tokens.shape)} != parents shape {list(parents.shape)}")
    if num_rows and (num_nodes.min() < 0 or num_nodes.max() > tokens.shape[1]):
        raise TreeValidationError(f"trees: num_nodes outside [0, {tokens.shape[1]}]")
    errors = {}
    for error in msg.errors:
        if not 0 <= error.row < num_rows:
            raise TreeValidationError(f"trees: error for row {error.row} of {num_rows}")
        errors[error.row] = (error.error, error.error_code)
    return DraftedTrees(tokens, parents, num_nodes, committed, errors)


def _tree_array(msg: tensor_pb2.Tensor, name: str, num_rows: int, max_width: int) -> np.ndarray:
    """-> (num_rows, W) int64, 1 <= W <= max_width, from an int32 tensor."""
    array = codec.array_from_proto(msg, f"trees.{name}", dtype=torch.int32, ndim=2,
                                   error=TreeValidationError)
    if array.shape[0] != num_rows or not 1 <= array.shape[1] <= max_width:
        raise TreeValidationError(
            f"trees.{name}: shape {list(array.shape)}, expected [{num_rows}, 1..{max_width}]")
    return array.astype(np.int64)
