"""Wire codec: ddtree.v1 protobuf messages <-> torch tensors and the engine's dataclasses.

Both services and their clients convert here and nowhere else. Tensors travel as raw
little-endian bytes with dtype and shape beside them (SERVING.md); decoding is one
`numpy.frombuffer` plus one copy, never a per-element loop. Everything that arrives from
outside is checked before it is trusted: a malformed message raises
`InvalidArgumentError` / `TreeValidationError` with a message saying what was wrong.
"""

from __future__ import annotations

import math
from typing import cast

import grpc
import numpy as np
import torch
from torch import Tensor

from ddtree.engine import MAX_BUDGET, Mode, SpecParams, TokenLogprob
from ddtree.errors import (
    CapacityError,
    InvalidArgumentError,
    SessionNotFoundError,
    TreeValidationError,
)
from ddtree.sampling import SamplingParams
from ddtree.stats import GenerationStats
from ddtree.tree import DraftTree, depths_from_parents
from ddtree.v1 import common_pb2, tensor_pb2, verifier_pb2

# One tensor may hold at most this many elements (1 GiB of float32): a bigger shape is a
# corrupt or hostile message, and checking it first keeps prod(shape) from overflowing.
MAX_TENSOR_ELEMENTS = 1 << 28

# (torch dtype, little-endian numpy dtype of the raw bytes). numpy has no bfloat16, so its
# bytes travel as uint16 and are reinterpreted with Tensor.view.
_DTYPES: dict[tensor_pb2.DType, tuple[torch.dtype, str]] = {
    tensor_pb2.DTYPE_FLOAT32: (torch.float32, "<f4"),
    tensor_pb2.DTYPE_FLOAT16: (torch.float16, "<f2"),
    tensor_pb2.DTYPE_BFLOAT16: (torch.bfloat16, "<u2"),
    tensor_pb2.DTYPE_INT32: (torch.int32, "<i4"),
    tensor_pb2.DTYPE_INT64: (torch.int64, "<i8"),
    tensor_pb2.DTYPE_BOOL: (torch.bool, "|b1"),
}
_TORCH_TO_PB = {torch_dtype: pb for pb, (torch_dtype, _) in _DTYPES.items()}
_NATIVE = {pb: np.dtype(np_dtype).newbyteorder("=") for pb, (_, np_dtype) in _DTYPES.items()}
# numpy's dtypes with a wire dtype (bfloat16 has no numpy dtype, uint16 is not one).
_NUMPY_TO_PB = {_NATIVE[pb]: pb for pb in _DTYPES if pb != tensor_pb2.DTYPE_BFLOAT16}

_MODE_TO_PB: dict[str, common_pb2.Mode] = {
    "ar": common_pb2.MODE_AR,
    "linear": common_pb2.MODE_LINEAR,
    "tree": common_pb2.MODE_TREE,
    "shadow": common_pb2.MODE_SHADOW,
    "auto": common_pb2.MODE_AUTO,
}
_PB_TO_MODE: dict[int, str] = {int(pb): mode for mode, pb in _MODE_TO_PB.items()}


# ---------------------------------------------------------------------------- tensors


def tensor_to_proto(tensor: Tensor, out: tensor_pb2.Tensor | None = None) -> tensor_pb2.Tensor:
    """Encodes any supported tensor (any device, any layout) as row-major LE bytes; into
    `out` (an empty Tensor message, e.g. a field of the message being built) when given,
    which saves upb's copy of the bytes when a submessage is assigned."""
    if tensor.dtype not in _TORCH_TO_PB:
        raise InvalidArgumentError(f"cannot encode a tensor of dtype {tensor.dtype}")
    host = tensor.detach().to("cpu").contiguous()
    if host.dtype == torch.bfloat16:
        host = host.view(torch.uint16)
    return _fill(out, _TORCH_TO_PB[tensor.dtype], host.numpy())


def array_to_proto(array: np.ndarray, out: tensor_pb2.Tensor | None = None) -> tensor_pb2.Tensor:
    """A host int32 / int64 / float32 / float16 / bool array as a Tensor message (no torch
    on the way: the host's small arrays, e.g. the drafter's trees); `out` as in
    tensor_to_proto."""
    pb_dtype = _NUMPY_TO_PB.get(array.dtype)
    if pb_dtype is None:
        raise InvalidArgumentError(f"cannot encode an array of dtype {array.dtype}")
    return _fill(out, pb_dtype, array)


def _fill(out: tensor_pb2.Tensor | None, pb_dtype: tensor_pb2.DType,
          array: np.ndarray) -> tensor_pb2.Tensor:
    msg = tensor_pb2.Tensor() if out is None else out
    msg.dtype = pb_dtype
    msg.shape.extend(array.shape)
    msg.data = np.ascontiguousarray(array, dtype=_DTYPES[pb_dtype][1]).tobytes()
    return msg


def tensor_from_proto(
    msg: tensor_pb2.Tensor,
    what: str = "tensor",
    *,
    dtype: torch.dtype | None = None,
    ndim: int | None = None,
    error: type[InvalidArgumentError] = InvalidArgumentError,
) -> Tensor:
    """Decodes a Tensor message into a fresh, writable CPU tensor.

    `what` names the field in error messages; `dtype` / `ndim` are the caller's
    expectations (checked before any byte is read). Raises `error` when malformed.
    """
    array, torch_dtype = _decode(msg, what, dtype, ndim, error)
    out = torch.from_numpy(array)
    if torch_dtype == torch.bfloat16:
        out = out.view(torch.bfloat16)
    return out


def array_from_proto(
    msg: tensor_pb2.Tensor,
    what: str,
    *,
    dtype: torch.dtype,
    ndim: int,
    error: type[InvalidArgumentError] = InvalidArgumentError,
) -> np.ndarray:
    """`tensor_from_proto` into a fresh, writable numpy array (native byte order), for
    the host's small arrays; `dtype` (not bfloat16: numpy has none) is required."""
    assert dtype != torch.bfloat16, "numpy has no bfloat16: use tensor_from_proto"
    return _decode(msg, what, dtype, ndim, error)[0]


def _decode(
    msg: tensor_pb2.Tensor, what: str, dtype: torch.dtype | None, ndim: int | None,
    error: type[InvalidArgumentError],
) -> tuple[np.ndarray, torch.dtype]:
    """The checks of a Tensor message, then its bytes as a shaped array (bfloat16 as its
    uint16 bits) and the torch dtype they are."""
    if msg.dtype not in _DTYPES:
        raise error(f"{what}: unknown dtype {msg.dtype}")
    torch_dtype, np_dtype = _DTYPES[msg.dtype]
    if dtype is not None and torch_dtype != dtype:
        raise error(f"{what}: dtype must be {dtype}, got {torch_dtype}")
    shape = tuple(msg.shape)
    if ndim is not None and len(shape) != ndim:
        raise error(f"{what}: expected {ndim} dimensions, got shape {list(shape)}")
    if shape and min(shape) < 0:
        raise error(f"{what}: negative dimension in shape {list(shape)}")
    size = math.prod(shape)
    if size > MAX_TENSOR_ELEMENTS or (shape and max(shape) > MAX_TENSOR_ELEMENTS):
        raise error(f"{what}: shape {list(shape)} exceeds {MAX_TENSOR_ELEMENTS} elements")
    native = _NATIVE[msg.dtype]
    data = msg.data
    if len(data) != size * native.itemsize:
        raise error(
            f"{what}: {len(data)} bytes of data, expected {size * native.itemsize} for shape "
            f"{list(shape)} of {torch_dtype}"
        )
    # astype to the native byte order copies once, which also makes the array writable.
    return np.frombuffer(data, dtype=np_dtype).astype(native).reshape(shape), torch_dtype


# ---------------------------------------------------------------------------- trees


def tree_to_proto(tree: DraftTree, row: int = 0) -> common_pb2.DraftTree:
    """Row `row` of a batched DraftTree as a DraftTree message (scores when the tree has them)."""
    msg = common_pb2.DraftTree(tokens=tree.tokens[row].tolist(), parents=tree.parents[row].tolist())
    if tree.scores is not None:
        msg.scores.CopyFrom(tensor_to_proto(tree.scores[row].float()))
    return msg


def tree_from_proto(
    msg: common_pb2.DraftTree, device: torch.device | str = "cpu", max_nodes: int | None = None
) -> DraftTree:
    """A DraftTree message as a batch-1 DraftTree (B = 1) on `device`.

    Checks what the conversion needs (node count first, matching lengths, parent order,
    score dtype and shape); vocabulary, sibling and root-token checks are
    `ddtree.tree_validation.validate_tree`'s and the session's.
    """
    num_nodes = len(msg.tokens)
    if num_nodes == 0:
        raise TreeValidationError("tree: no nodes (node 0, the root, is required)")
    if max_nodes is not None and num_nodes - 1 > max_nodes:
        raise TreeValidationError(
            f"tree: {num_nodes - 1} nodes besides the root exceed max_nodes {max_nodes}"
        )
    if len(msg.parents) != num_nodes:
        raise TreeValidationError(f"tree: {len(msg.tokens)} tokens but {len(msg.parents)} parents")
    tokens = torch.tensor(list(msg.tokens), dtype=torch.int64)  # (1+N,)
    parents = torch.tensor(list(msg.parents), dtype=torch.int64)  # (1+N,)
    if parents[0] != -1:
        raise TreeValidationError(f"tree: parents[0] must be -1 (the root), got {parents[0]}")
    index = torch.arange(num_nodes)
    bad = ((parents[1:] < 0) | (parents[1:] >= index[1:])).nonzero()
    if bad.numel():
        i = int(bad[0, 0]) + 1
        raise TreeValidationError(
            f"tree: parents[{i}] = {int(parents[i])} must be a node before {i} "
            "(0 <= parents[i] < i; this also rules out cycles)"
        )
    scores = None
    if msg.HasField("scores"):
        scores = tensor_from_proto(
            msg.scores, "tree.scores", dtype=torch.float32, ndim=1, error=TreeValidationError
        )
        if scores.shape[0] != num_nodes:
            raise TreeValidationError(
                f"tree.scores: shape {list(scores.shape)}, expected [{num_nodes}] (1+N)"
            )
        scores = scores.unsqueeze(0).to(device)
    return DraftTree(
        tokens=tokens.unsqueeze(0).to(device),
        parents=parents.unsqueeze(0).to(device),
        depth=depths_from_parents(parents).unsqueeze(0).to(device),
        scores=scores,
    )


# ---------------------------------------------------------------------------- params


def sampling_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    """SamplingParams message -> dataclass (top_p 0 reads as 1.0); validated."""
    params = SamplingParams(
        temperature=float(msg.temperature),
        top_k=int(msg.top_k),
        top_p=float(msg.top_p) if msg.top_p > 0 else 1.0,
        seed=int(msg.seed) if msg.HasField("seed") else None,
    )
    params.validate()
    return params


def sampling_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
    )
    if params.seed is not None:
        msg.seed = params.seed
    return msg


def mode_from_proto(value: int, default: str) -> Mode:
    if value == common_pb2.MODE_UNSPECIFIED:
        return cast(Mode, default)
    if value not in _PB_TO_MODE:
        raise InvalidArgumentError(f"spec.mode: unknown mode {value}")
    return cast(Mode, _PB_TO_MODE[value])


def spec_from_proto(
    msg: common_pb2.SpecParams, default: SpecParams, max_budget: int | None = None
) -> SpecParams:
    """SpecParams message -> dataclass; 0 / unspecified fields take the server's default."""
    if msg.budget < 0 or msg.max_topk < 0:
        raise InvalidArgumentError(
            f"spec: budget ({msg.budget}) and max_topk ({msg.max_topk}) must be >= 0"
        )
    spec = SpecParams(
        mode=mode_from_proto(msg.mode, default.mode),
        budget=msg.budget or default.budget,
        max_topk=msg.max_topk or default.max_topk,
    )
    spec.validate(max_budget or MAX_BUDGET)
    return spec


def spec_to_proto(
    spec: SpecParams, out: common_pb2.SpecParams | None = None
) -> common_pb2.SpecParams:
    """`out`: an empty SpecParams to write into (see tensor_to_proto)."""
    msg = common_pb2.SpecParams() if out is None else out
    msg.mode, msg.budget, msg.max_topk = _MODE_TO_PB[spec.mode], spec.budget, spec.max_topk or 0
    return msg


def stats_to_proto(stats: GenerationStats) -> common_pb2.SpecStats:
    return common_pb2.SpecStats(
        mode=stats.mode,
        budget=stats.budget,
        num_rounds=stats.num_rounds,
        mean_acceptance_length=stats.mean_acceptance_length,
        acceptance_histogram=stats.acceptance_histogram(),
        num_drafted_nodes=stats.num_drafted_nodes,
        num_accepted_draft_tokens=stats.num_accepted_draft_tokens,
        stage_seconds=dict(stats.stage_seconds),
        num_prompt_tokens=stats.num_prompt_tokens,
        num_completion_tokens=stats.num_completion_tokens,
    )


def logprobs_to_proto(logprobs: list[TokenLogprob]) -> list[verifier_pb2.TokenLogprob]:
    """The engine's (token, logprob, [(alternative, logprob)...]) -> TokenLogprob messages."""
    return [
        verifier_pb2.TokenLogprob(
            token_id=token,
            logprob=logprob,
            top=[verifier_pb2.TopLogprob(token_id=t, logprob=lp) for t, lp in top],
        )
        for token, logprob, top in logprobs
    ]


# ---------------------------------------------------------------------------- errors


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status a library error crosses the wire as (SERVING.md); INTERNAL otherwise.

    verifier_svc/status.py aborts RPCs with it; drafter_svc uses it for per-item errors.
    """
    if isinstance(exc, InvalidArgumentError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, SessionNotFoundError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, CapacityError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INTERNAL
