"""scripts/gpu/random_target.py (lease calls r156 / r157: the demo target's shapes with
random weights, built on the GPU host from its carried config and tokenizer) writes a
checkpoint our loader takes and the engine generates from, of the source target's shapes."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from ddtree.models.checkpoint import read_tensors
from ddtree.models.target import load_target
from ddtree.models.tiny import make_tiny_pair

REPO = Path(__file__).resolve().parents[2]


def test_random_target_loads_with_the_source_shapes(tmp_path: Path) -> None:
    target, _ = make_tiny_pair(tmp_path / "pair")
    carried = tmp_path / "carried"  # what make_carry.sh puts in .carry/rand
    carried.mkdir()
    for path in target.iterdir():
        if path.name == "tokenizer.json":
            (carried / "tokenizer.json.gz").write_bytes(gzip.compress(path.read_bytes()))
        elif path.suffix in (".json", ".jinja") and path.name != "model.safetensors.index.json":
            shutil.copy(path, carried / path.name)
    out = tmp_path / "random"
    done = subprocess.run([sys.executable, "scripts/gpu/random_target.py", str(carried),
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                               "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()

    source = read_tensors(target, "cpu", torch.float32)
    written = read_tensors(out, "cpu", torch.float32)
    assert set(written) == set(source)  # tied embeddings: no lm_head in either
    for name, tensor in written.items():
        assert tensor.shape == source[name].shape, name
        assert not torch.equal(tensor, source[name]) or name.endswith("norm.weight"), name

    model = load_target(out, "cpu", torch.float32)
    logits = model.causal(torch.tensor([[5, 17, 42, 7]])).logits
    assert logits.shape[:2] == (1, 4) and torch.isfinite(logits).all()
    assert logits[0].argmax(-1).unique().numel() > 1  # varied greedy tokens, not one repeated
