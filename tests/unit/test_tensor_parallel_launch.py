"""Starting a tensor-parallel group (real processes, gloo on the CPU): TP 4 on a target
with 8 query / 4 KV heads computes the unsharded logits, sizes that do not divide the heads
are refused before anything starts, and a follower that dies is reported. (Separate from
test_tensor_parallel.py: a process holds one default process group at a time.)"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from ddtree.errors import InvalidArgumentError
from ddtree.models.target import load_target
from ddtree.models.tiny import make_tiny_pair
from ddtree.tp_launch import rank_devices
from tests.unit.test_tensor_parallel import assert_sharded_forward_matches, leader, start


def write_wide_target(out_dir: Path) -> Path:
    """A random Llama with 8 query and 4 KV heads (the demo pair has 4 / 2: no TP 4)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                         head_dim=8, max_position_embeddings=256, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(str(out_dir))
    return out_dir


def test_tp4_forward_logits_equal_the_unsharded_target(tmp_path: Path) -> None:
    target_dir = write_wide_target(tmp_path / "wide")
    group = start(target_dir, 4)
    try:
        full = load_target(target_dir, "cpu", torch.float32)
        assert_sharded_forward_matches(full, leader(group))
    finally:
        group.stop()


def test_sizes_that_do_not_divide_the_heads_are_refused(tmp_path: Path) -> None:
    target_dir, _ = make_tiny_pair(tmp_path)  # 4 query heads, 2 KV heads
    for size in (3, 4):
        with pytest.raises(InvalidArgumentError, match="does not divide"):
            start(target_dir, size)
    with pytest.raises(InvalidArgumentError, match="lists 1 GPU"):
        rank_devices(2, torch.device("cuda"), "0")


def test_a_follower_that_dies_is_reported(tmp_path: Path) -> None:
    target_dir, _ = make_tiny_pair(tmp_path)
    deaths: list[int] = []
    group = start(target_dir, 2, deaths)
    try:
        reported = threading.Event()
        pid = group.followers[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if deaths:
                reported.set()
                break
            threading.Event().wait(0.05)
        assert reported.is_set() and deaths == [1]
    finally:
        group.stop()
