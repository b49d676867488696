"""Reading and writing HF-format checkpoint directories: `config.json` and safetensors
weights, either one `model.safetensors` or shards `model-0000i-of-0000N.safetensors` listed
by `model.safetensors.index.json` (transformers' and z-lab's layout).

Only JSON and safetensors are ever parsed (no pickle, no remote code), so a checkpoint from
the Hub cannot run code here. Every failure a user can cause (missing directory or file,
bad JSON, corrupt or truncated safetensors, missing tensor) is a CheckpointError naming
the file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from ddtree.errors import CheckpointError

CONFIG_NAME = "config.json"
SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# A lent GPU returns files of at most 16 MiB; the header (names, shapes, offsets) is small.
MAX_SHARD_BYTES = 16 * 2**20
HEADER_BYTES = 1024  # a safetensors file's fixed header part (length, metadata), generously


def read_json(file: Path) -> dict[str, Any]:
    """The JSON object in `file`; CheckpointError if it is missing or not a JSON object."""
    if not file.is_file():
        raise CheckpointError(f"missing {file.name} in {file.parent}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot parse {file}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} holds a {type(data).__name__}, not a JSON object")
    return data


def read_config(path: Path) -> dict[str, Any]:
    """The `config.json` dict of checkpoint directory `path`."""
    return read_json(_checkpoint_dir(path) / CONFIG_NAME)


def weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it (a single file, else the shard index).

    For a single file the names are read from its header only (cheap: no tensor data)."""
    path = _checkpoint_dir(path)
    single = path / SINGLE_NAME
    if single.is_file():
        return dict.fromkeys(_names_in(single), single)
    index = path / INDEX_NAME
    if not index.is_file():
        raise CheckpointError(f"no {SINGLE_NAME} or {INDEX_NAME} in {path} "
                              "(only safetensors checkpoints are supported)")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has no 'weight_map' object")
    return {name: _shard_path(path, index, shard) for name, shard in weight_map.items()}


def read_tensors(
    path: Path,
    device: torch.device | str,
    dtype: torch.dtype,
    select: Callable[[str], bool] | None = None,
) -> dict[str, Tensor]:
    """Loads the tensors of checkpoint `path` whose name `select` accepts (all when None).

    Floating-point tensors are cast to `dtype`; everything is moved to `device`. Only the
    selected tensors' bytes are read (safetensors files are memory-mapped)."""
    files = weight_files(path)
    names = [name for name in files if select is None or select(name)]
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    tensors: dict[str, Tensor] = {}
    for file, file_names in by_file.items():
        tensors.update(_read_file(file, file_names, device, dtype))
    return tensors


def require_tensors(tensors: dict[str, Tensor], names: Iterable[str], path: Path) -> None:
    """CheckpointError listing the `names` that `tensors` lacks."""
    missing = sorted(set(names) - tensors.keys())
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise CheckpointError(f"checkpoint {path} lacks {len(missing)} tensor(s): {shown}")


def _checkpoint_dir(path: Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    return path


def _shard_path(root: Path, index: Path, shard: object) -> Path:
    """A shard named by the index, refused if it would point outside the checkpoint."""
    if not isinstance(shard, str) or Path(shard).name != shard:
        raise CheckpointError(f"{index} names an invalid shard file {shard!r}")
    return root / shard


def _names_in(file: Path) -> list[str]:
    try:
        with safe_open(str(file), framework="pt") as reader:
            return list(reader.keys())
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"corrupt safetensors file {file}: {exc}") from exc


def _read_file(file: Path, names: list[str], device: torch.device | str,
               dtype: torch.dtype) -> dict[str, Tensor]:
    if not file.is_file():
        raise CheckpointError(f"missing shard {file.name} in {file.parent}")
    out: dict[str, Tensor] = {}
    try:
        with safe_open(str(file), framework="pt") as reader:
            present = set(reader.keys())
            for name in names:
                if name not in present:
                    raise CheckpointError(f"{file} lacks tensor {name!r} listed in the index")
                tensor = reader.get_tensor(name)
                cast = dtype if tensor.is_floating_point() else tensor.dtype
                out[name] = tensor.to(device=device, dtype=cast)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"corrupt safetensors file {file}: {exc}") from exc
    return out


def write_tensors(tensors: dict[str, Tensor], path: Path,
                  max_shard_bytes: int = MAX_SHARD_BYTES) -> list[Path]:
    """Writes `tensors` (CPU, contiguous) into checkpoint directory `path`: one
    `model.safetensors` when it fits in `max_shard_bytes`, else shard files of at most
    that many bytes each, header included (tensors in name order, a new shard when the
    next would not fit)
    plus the index. Weight files of an earlier save are removed first, so the loader never
    sees a stale single file beside new shards. Returns the files written."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for old in [path / SINGLE_NAME, path / INDEX_NAME, *path.glob("model-*-of-*.safetensors")]:
        old.unlink(missing_ok=True)
    groups: list[list[str]] = [[]]
    size = HEADER_BYTES
    for name in sorted(tensors):
        # the tensor's bytes and its header entry (name, dtype, shape, offsets as JSON)
        nbytes = tensors[name].numel() * tensors[name].element_size() + len(name) + 128
        if HEADER_BYTES + nbytes > max_shard_bytes:
            raise CheckpointError(f"tensor {name} ({nbytes} bytes) exceeds the shard limit "
                                  f"of {max_shard_bytes} bytes")
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = HEADER_BYTES
        groups[-1].append(name)
        size += nbytes
    if len(groups) == 1:
        save_file(tensors, str(path / SINGLE_NAME), metadata={"format": "pt"})
        return [path / SINGLE_NAME]
    files, weight_map = [], {}
    for i, names in enumerate(groups):
        file = path / f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(file), metadata={"format": "pt"})
        files.append(file)
        weight_map.update(dict.fromkeys(names, file.name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*files, path / INDEX_NAME]
