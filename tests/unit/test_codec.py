"""The wire codec: tensors round-trip bit-exactly in every dtype (bfloat16 included), trees
and parameters convert both ways, and malformed messages fail with a clear typed error."""

from __future__ import annotations

import grpc
import pytest
import torch

from ddtree import codec
from ddtree.engine import SpecParams
from ddtree.errors import (
    CapacityError,
    InvalidArgumentError,
    SessionNotFoundError,
    TreeValidationError,
)
from ddtree.sampling import SamplingParams
from ddtree.stats import GenerationStats
from ddtree.tree import DraftTree
from ddtree.v1 import common_pb2, tensor_pb2

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (0, 4), (7,), ()])
def test_tensor_round_trip_is_bit_exact(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    source = (torch.randn(shape, generator=gen) * 100).to(dtype)
    decoded = codec.tensor_from_proto(codec.tensor_to_proto(source))
    assert decoded.dtype == dtype and tuple(decoded.shape) == shape
    assert torch.equal(decoded, source)
    decoded.zero_()  # a fresh, writable tensor (not a view of the message's bytes)


def test_tensor_bytes_are_little_endian_row_major() -> None:
    msg = codec.tensor_to_proto(torch.tensor([[1, 2], [3, 258]], dtype=torch.int32).t())
    assert list(msg.shape) == [2, 2]
    assert msg.data == bytes([1, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2, 1, 0, 0])


def test_bfloat16_travels_as_its_raw_bits() -> None:
    msg = codec.tensor_to_proto(torch.tensor([1.0], dtype=torch.bfloat16))
    assert msg.dtype == tensor_pb2.DTYPE_BFLOAT16 and msg.data == b"\x80\x3f"


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (
            tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[2, 2], data=b"\0" * 12),
            "12 bytes",
        ),
        (tensor_pb2.Tensor(dtype=99, shape=[1], data=b"\0"), "unknown dtype"),
        (tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[-1, 4], data=b""), "negative"),
        (tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_INT64, shape=[1 << 20, 1 << 20]), "exceeds"),
    ],
    ids=["byte-length", "dtype", "negative-dim", "too-many-elements"],
)
def test_malformed_tensor_is_rejected(msg: tensor_pb2.Tensor, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        codec.tensor_from_proto(msg, "features")


def test_tensor_expectations_are_checked() -> None:
    msg = codec.tensor_to_proto(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(TreeValidationError, match="dtype must be torch.float32"):
        codec.tensor_from_proto(msg, dtype=torch.float32, error=TreeValidationError)
    with pytest.raises(InvalidArgumentError, match="expected 1 dimensions"):
        codec.tensor_from_proto(msg, ndim=1)


def test_tree_round_trip_recomputes_depth() -> None:
    parents = [-1, 0, 0, 1, 3, 2, 4]
    msg = common_pb2.DraftTree(tokens=[9, 1, 2, 3, 4, 5, 6], parents=parents)
    tree = codec.tree_from_proto(msg)
    assert tree.tokens.shape == (1, 7) and tree.tokens.dtype == torch.int64
    assert tree.depth[0].tolist() == [0, 1, 1, 2, 3, 2, 4]
    back = codec.tree_to_proto(tree)
    assert list(back.tokens) == list(msg.tokens) and list(back.parents) == parents


def test_chain_of_many_nodes_gets_every_depth() -> None:
    n = 300
    tree = codec.tree_from_proto(
        common_pb2.DraftTree(tokens=[1] * n, parents=[-1] + list(range(n - 1)))
    )
    assert tree.depth[0].tolist() == list(range(n))


@pytest.mark.parametrize(
    ("tokens", "parents", "message"),
    [
        ([], [], "no nodes"),
        ([1, 2], [-1], "2 tokens but 1 parents"),
        ([1, 2], [0, 0], "parents\\[0\\] must be -1"),
        ([1, 2, 3], [-1, 2, 0], "parents\\[1\\] = 2 must be a node before 1"),
        ([1, 2, 3], [-1, 2, 1], "parents\\[1\\] = 2"),  # a cycle 1 <-> 2
        ([1, 2], [-1, -1], "parents\\[1\\] = -1"),  # a second root
    ],
)
def test_malformed_tree_is_rejected(tokens: list[int], parents: list[int], message: str) -> None:
    with pytest.raises(TreeValidationError, match=message):
        codec.tree_from_proto(common_pb2.DraftTree(tokens=tokens, parents=parents))


def test_tree_scores_must_be_float32_of_one_per_node() -> None:
    msg = common_pb2.DraftTree(tokens=[1, 2], parents=[-1, 0])
    msg.scores.CopyFrom(codec.tensor_to_proto(torch.zeros(3)))
    with pytest.raises(TreeValidationError, match="expected \\[2\\]"):
        codec.tree_from_proto(msg)
    msg.scores.CopyFrom(codec.tensor_to_proto(torch.zeros(2, dtype=torch.int32)))
    with pytest.raises(TreeValidationError, match="dtype must be torch.float32"):
        codec.tree_from_proto(msg)


def test_sampling_params_read_zero_top_p_as_off() -> None:
    params = codec.sampling_from_proto(common_pb2.SamplingParams(temperature=0.5, top_k=3))
    assert params == SamplingParams(temperature=0.5, top_k=3, top_p=1.0, seed=None)
    seeded = codec.sampling_from_proto(codec.sampling_to_proto(SamplingParams(0.7, 0, 0.9, 42)))
    assert seeded.seed == 42 and seeded.top_p == pytest.approx(0.9)
    with pytest.raises(InvalidArgumentError):
        codec.sampling_from_proto(common_pb2.SamplingParams(temperature=-1.0))


def test_spec_params_take_server_defaults_for_zeros() -> None:
    default = SpecParams("tree", 15, 8)
    assert codec.spec_from_proto(common_pb2.SpecParams(), default) == default
    msg = common_pb2.SpecParams(mode=common_pb2.MODE_LINEAR, budget=4)
    assert codec.spec_from_proto(msg, default) == SpecParams("linear", 4, 8)
    assert codec.spec_from_proto(codec.spec_to_proto(SpecParams("shadow", 3)), default) == (
        SpecParams("shadow", 3, 8)
    )
    with pytest.raises(InvalidArgumentError, match="budget"):
        codec.spec_from_proto(common_pb2.SpecParams(budget=65), default, max_budget=64)
    with pytest.raises(InvalidArgumentError, match="unknown mode"):
        codec.spec_from_proto(common_pb2.SpecParams(mode=42), default)


def test_stats_carry_derived_acceptance_numbers() -> None:
    stats = GenerationStats("tree", 8)
    for length in (3, 1, 3):
        stats.record_round(length, 8)
    stats.stage_seconds["verify"] += 0.5
    msg = codec.stats_to_proto(stats)
    assert msg.num_rounds == 3 and msg.mean_acceptance_length == pytest.approx(7 / 3)
    assert list(msg.acceptance_histogram) == [0, 1, 0, 2]
    assert msg.num_drafted_nodes == 24 and msg.num_accepted_draft_tokens == 4
    assert dict(msg.stage_seconds) == {"verify": 0.5}


def test_library_errors_map_to_status_codes() -> None:
    assert codec.status_code_for(TreeValidationError("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert codec.status_code_for(SessionNotFoundError("x")) == grpc.StatusCode.NOT_FOUND
    assert codec.status_code_for(CapacityError("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert codec.status_code_for(RuntimeError("x")) == grpc.StatusCode.INTERNAL


def test_tree_to_proto_takes_the_requested_row() -> None:
    tokens = torch.tensor([[5, 6], [7, 8]])
    parents = torch.tensor([[-1, 0], [-1, 0]])
    tree = DraftTree(tokens=tokens, parents=parents, depth=torch.tensor([[0, 1], [0, 1]]))
    assert list(codec.tree_to_proto(tree, row=1).tokens) == [7, 8]
