"""The verifier refuses a drafter that cannot serve its target (instead of running at
acceptance ~1 in silence): hidden size, vocabulary, layer count and layer ids; and one
that speaks an older Draft wire version (it would answer no batch)."""

from __future__ import annotations

import pytest

from ddtree.draft_codec import DRAFT_WIRE_VERSION
from ddtree.models.target_config import TargetConfig
from ddtree.v1 import drafter_pb2
from verifier_svc.drafter_client import incompatibility, wire_problem

TARGET = TargetConfig.from_hf({
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 384,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 512, "eos_token_id": 2,
})


def info(**changes: object) -> drafter_pb2.DrafterInfo:
    fields: dict[str, object] = dict(hidden_size=64, vocab_size=384, num_target_layers=4,
                                     target_layer_ids=[1, 2], block_size=8)
    return drafter_pb2.DrafterInfo(**(fields | changes))


def test_a_matching_drafter_is_accepted() -> None:
    assert incompatibility(info(), TARGET) is None


@pytest.mark.parametrize("changes, words", [
    ({"hidden_size": 128}, "hidden size 128"),
    ({"vocab_size": 500}, "vocab size 500"),
    ({"num_target_layers": 36}, "36-layer target"),
    ({"target_layer_ids": [1, 4]}, "layers [4]"),
])
def test_a_drafter_for_another_target_is_refused(changes: dict, words: str) -> None:
    problem = incompatibility(info(**changes), TARGET)
    assert problem is not None and words in problem


def test_a_drafter_of_an_older_wire_version_is_refused() -> None:
    assert wire_problem(info(wire_version=DRAFT_WIRE_VERSION)) is None
    problem = wire_problem(info())  # unset: version 1, DraftItems only
    assert problem is not None and "wire version 1" in problem
