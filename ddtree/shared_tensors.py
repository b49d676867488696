"""Tensors and CUDA events of one process opened by another on the same host: what lets
the drafter service run its draft half over the verifier's own round state (the shared
draft link, verifier_svc/shared_drafter.py and drafter_svc/shared_round.py).

A tensor travels as a small description (`export`, JSON-safe) plus, on the CPU, a file
descriptor of its shared memory, sent beside the description over the Unix socket
(SCM_RIGHTS). On a GPU the description carries the CUDA IPC handle of the tensor's
memory (torch's `reduce_tensor`, the same handle torch.multiprocessing sends), which the
other process opens on its own index of the same device. Either way both processes read
and write the same memory: no copy per round. CUDA events travel as their IPC handles.

The exporting process keeps every exported tensor alive for as long as the other may use
it (the verifier's round state lives as long as its engine).
"""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch import Tensor
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor


class SharingError(RuntimeError):
    """A tensor or event that cannot be shared or opened here (another GPU, no CUDA IPC)."""


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise SharingError(f"unknown dtype {name!r}")
    return dtype


def export(tensor: Tensor, fds: list[int]) -> dict[str, Any]:
    """`tensor`'s description for `open_tensor`; on the CPU its storage is moved into
    shared memory (in place: views keep working) and the descriptor appended to `fds`."""
    if tensor.device.type == "cuda":
        _, args = reduce_tensor(tensor)
        (_, size, stride, offset, _, dtype, _, handle, storage_size, storage_offset,
         _, ref_handle, ref_offset, event_handle, event_sync) = args
        return {"kind": "cuda", "shape": list(size), "stride": list(stride),
                "offset": offset, "dtype": str(dtype), "handle": _b64(handle),
                "storage_size": storage_size, "storage_offset": storage_offset,
                "ref_handle": _b64(ref_handle), "ref_offset": ref_offset,
                "event_handle": _b64(event_handle), "event_sync": bool(event_sync)}
    if tensor.device.type != "cpu":
        raise SharingError(f"cannot share a tensor on {tensor.device}")
    tensor.share_memory_()
    fd, size = tensor.untyped_storage()._share_fd_cpu_()  # type: ignore[attr-defined]
    fds.append(fd)
    return {"kind": "cpu", "shape": list(tensor.shape), "stride": list(tensor.stride()),
            "offset": tensor.storage_offset(), "dtype": str(tensor.dtype),
            "fd_index": len(fds) - 1, "storage_size": size}


def open_tensor(description: dict[str, Any], fds: list[int], device: torch.device) -> Tensor:
    """The tensor `export` described, in this process (a GPU tensor on `device`, which
    the caller checked is the exporter's GPU)."""
    dtype = _dtype(description["dtype"])
    shape, stride = tuple(description["shape"]), tuple(description["stride"])
    if description["kind"] == "cuda":
        if device.type != "cuda":
            raise SharingError("a GPU tensor cannot be opened on the CPU")
        try:
            return rebuild_cuda_tensor(
                torch.Tensor, shape, stride, description["offset"], torch.UntypedStorage,
                dtype, device.index if device.index is not None else 0,
                _unb64(description["handle"]), description["storage_size"],
                description["storage_offset"], False, _unb64(description["ref_handle"]),
                description["ref_offset"], _unb64(description["event_handle"]),
                description["event_sync"])
        except RuntimeError as exc:  # another GPU, or IPC unsupported (containers)
            raise SharingError(f"cannot open the shared GPU tensor: {exc}") from exc
    if device.type != "cpu":
        raise SharingError("a CPU tensor cannot be opened on a GPU")
    fd = fds[description["fd_index"]]
    storage = torch.UntypedStorage._new_shared_fd_cpu(  # type: ignore[attr-defined]
        fd, description["storage_size"])
    return torch.empty(0, dtype=dtype).set_(storage, description["offset"], shape, stride)


def new_event(device: torch.device) -> torch.cuda.Event | None:
    """An event another process may record and wait on (None on the CPU, where the
    work is done when the peer answers)."""
    if device.type != "cuda":
        return None
    return torch.cuda.Event(enable_timing=False, blocking=False, interprocess=True)


def export_event(event: torch.cuda.Event | None) -> str | None:
    return None if event is None else _b64(event.ipc_handle())


def open_event(handle: str | None, device: torch.device) -> torch.cuda.Event | None:
    if handle is None:
        return None
    raw = _unb64(handle)
    assert raw is not None
    try:
        return torch.cuda.Event.from_ipc_handle(device, raw)
    except RuntimeError as exc:
        raise SharingError(f"cannot open the shared CUDA event: {exc}") from exc


def device_uuid(device: torch.device) -> str:
    """The GPU's UUID ("cpu" on the CPU): both ends of a shared link must see the same."""
    if device.type != "cuda":
        return "cpu"
    return str(torch.cuda.get_device_properties(device).uuid)
