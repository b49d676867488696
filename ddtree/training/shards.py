"""Token data on disk: response shards in numpy's `.npz` format, 2 bytes a token.

A shard holds whole sequences (prompt + the target's response, back to back):
`tokens` (total,) uint16 (int32 for vocabularies past 65,536), `offsets` (n+1,) int64,
`prompt_lens` (n,) int32, `prompt_index` (n,) int64 into the prompt list, `temperature`
(n,) float32, `ended` (n,) bool (the response ends with a stop token) and `digest`, the
fingerprint of the prompt list the indices refer to (a resumed run skips only prompts of
the same list). Files are zlib-compressed and written atomically (temp file + rename).

`export_packs` merges a work dir's shards into a few files of at most `max_bytes` each,
the form that travels through a lent GPU's output folder and is carried back next
session; a pack is itself a shard, so `import_packs` only copies files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESPONSES = "responses"
MAX_PACK_BYTES = 16 * 2**20 - 64 * 2**10  # a lent device returns files of <= 16 MiB


def prompts_digest(prompts: Sequence[Sequence[int]]) -> str:
    """A short fingerprint of a prompt list (token ids, in order)."""
    h = hashlib.sha256()
    for ids in prompts:
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        h.update(b"\xff")
    return h.hexdigest()[:16]


def token_dtype(vocab_size: int) -> type[np.integer[Any]]:
    return np.uint16 if vocab_size <= 1 << 16 else np.int32


def pack(sequences: Sequence[tuple[int, list[int], list[int], float, bool]], digest: str,
         vocab_size: int) -> dict[str, np.ndarray]:
    """(prompt index, prompt ids, response ids, temperature, ended) tuples -> shard arrays."""
    lengths = [len(p) + len(r) for _, p, r, _, _ in sequences]
    flat = [t for _, p, r, _, _ in sequences for t in (*p, *r)]
    return {
        "tokens": np.asarray(flat, dtype=token_dtype(vocab_size)),
        "offsets": np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
        "prompt_lens": np.asarray([len(p) for _, p, _, _, _ in sequences], dtype=np.int32),
        "prompt_index": np.asarray([s[0] for s in sequences], dtype=np.int64),
        "temperature": np.asarray([s[3] for s in sequences], dtype=np.float32),
        "ended": np.asarray([s[4] for s in sequences], dtype=bool),
        "digest": np.asarray(digest),
    }


def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    named: dict[str, Any] = dict(arrays)  # numpy's stubs type **kwds loosely
    with open(partial, "wb") as handle:
        np.savez_compressed(handle, **named)
    os.replace(partial, path)
    return path


def read_shard(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def shard_files(work_dir: Path, pattern: str = "*.npz") -> list[Path]:
    """The finished `.npz` shards (and carried packs) of a work dir, sorted by name;
    `pattern` = "shard-*.npz" for this work dir's own shards only."""
    return sorted((Path(work_dir) / RESPONSES).glob(pattern))


def next_shard_path(work_dir: Path) -> Path:
    taken = {p.name for p in (Path(work_dir) / RESPONSES).glob("shard-*.npz")}
    index = 0
    while f"shard-{index:05d}.npz" in taken:
        index += 1
    return Path(work_dir) / RESPONSES / f"shard-{index:05d}.npz"


def done_prompts(work_dir: Path, digest: str) -> set[int]:
    """Prompt indices already answered in shards made from the same prompt list."""
    done: set[int] = set()
    for path in shard_files(work_dir):
        shard = read_shard(path)
        if str(shard["digest"]) == digest:
            done.update(int(i) for i in shard["prompt_index"])
    return done


def merge(shards: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One shard holding the sequences of `shards` (in order); the digest of the first."""
    offsets, base = [np.zeros(1, dtype=np.int64)], 0
    for shard in shards:
        offsets.append(shard["offsets"][1:] + base)
        base += int(shard["offsets"][-1])
    out = {name: np.concatenate([s[name] for s in shards])
           for name in ("tokens", "prompt_lens", "prompt_index", "temperature", "ended")}
    return {**out, "offsets": np.concatenate(offsets), "digest": shards[0]["digest"]}


def export_packs(work_dir: Path, out_dir: Path, max_files: int,
                 max_bytes: int = MAX_PACK_BYTES, prefix: str = "tokens",
                 pattern: str = "*.npz") -> dict[str, Any]:
    """Merges the work dir's shards into at most `max_files` files `<prefix>-NNNNN.npz` of
    at most `max_bytes` each (whole shards, in order; what does not fit stays behind and
    is counted). Shards compressed apart bound the merged file's size; a file that still
    comes out too large is rewritten with one shard fewer. `pattern` selects the shards
    (e.g. only this session's, not the carried ones)."""
    paths = shard_files(work_dir, pattern)
    sizes = [p.stat().st_size for p in paths]
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    start = 0
    while start < len(paths) and len(written) < max_files:
        end, total = start, 0
        while end < len(paths) and total + sizes[end] <= max_bytes:
            total, end = total + sizes[end], end + 1
        end = max(end, start + 1)
        while True:
            target = out_dir / f"{prefix}-{len(written):05d}.npz"
            write_shard(target, merge([read_shard(p) for p in paths[start:end]]))
            if target.stat().st_size <= max_bytes or end - start == 1:
                break
            end -= 1
        if target.stat().st_size > max_bytes:  # a single shard larger than a pack
            target.unlink()
            start += 1
            continue
        written.append(target.name)
        start = end
    left = paths[start:]
    return {"files": written, "bytes": sum((out_dir / n).stat().st_size for n in written),
            "shards_left_behind": len(left)}


def import_packs(pack_dir: Path, work_dir: Path) -> list[Path]:
    """Copies carried packs (`*.npz`) into the work dir's shard folder as `carried-*`."""
    copied = []
    for path in sorted(Path(pack_dir).glob("*.npz")):
        dest = Path(work_dir) / RESPONSES / f"carried-{path.name}"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        copied.append(dest)
    return copied
