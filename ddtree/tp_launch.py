"""Starting a tensor-parallel group on one host: this process becomes rank 0 (the leader,
which runs the engine), `world_size - 1` spawned processes become the followers (each
loads its shard and runs `follow`). The group meets over TCP on loopback; NCCL on GPUs,
gloo on the CPU. A watchdog thread reports a follower that exits before it was told to
stop: the leader cannot go on without it (its next collective would wait forever).
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import cast

import structlog
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddtree.errors import InvalidArgumentError
from ddtree.models.checkpoint import read_config
from ddtree.models.target import TargetModel
from ddtree.models.target_config import TargetConfig
from ddtree.models.tensor_parallel import (
    TensorParallel,
    check_shardable,
    follow,
    load_target_shard,
)

log = structlog.get_logger("ddtree.tensor_parallel")

# How long ranks wait for each other when meeting (a follower loads its shard first).
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)
# How often a follower checks that its leader still lives.
PARENT_POLL_S = 1.0


@dataclass(frozen=True)
class GroupSpec:
    """target: checkpoint dir; devices: one per rank ("cpu" or "cuda:i"); invariant:
    batch-invariant GEMMs; port: the rendezvous port on loopback (0 = pick a free one)."""

    target: str
    dtype: torch.dtype
    devices: tuple[str, ...]
    invariant: bool = True
    port: int = 0

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def backend(self) -> str:
        return "nccl" if torch.device(self.devices[0]).type == "cuda" else "gloo"


def rank_devices(world_size: int, device: torch.device, gpus: str = "") -> tuple[str, ...]:
    """Each rank's device: the GPUs listed in `gpus` ("0,1"), else cuda:0 .. cuda:N-1 of
    the visible GPUs (CUDA_VISIBLE_DEVICES applies) when `device` is a GPU, else the CPU."""
    if gpus:
        indices = [int(i) for i in gpus.split(",") if i.strip()]
        if len(indices) != world_size:
            raise InvalidArgumentError(
                f"--verifier-gpus lists {len(indices)} GPU(s) for tensor-parallel size "
                f"{world_size}")
        return tuple(f"cuda:{i}" for i in indices)
    if device.type == "cuda":
        first = device.index or 0
        return tuple(f"cuda:{first + i}" for i in range(world_size))
    return ("cpu",) * world_size


class Group:
    """The leader's handle: its shard (`target`), the followers, the watchdog."""

    def __init__(self, spec: GroupSpec, followers: Sequence[BaseProcess]) -> None:
        self.spec, self.followers = spec, followers
        self.target: TargetModel | None = None
        self.tp: TensorParallel | None = None
        self._stopping = threading.Event()

    def watch(self, on_death: Callable[[int, int | None], None]) -> None:
        """Calls on_death(rank, exit code) from a thread when a follower exits unasked."""
        def run() -> None:
            sentinels = {p.sentinel: rank for rank, p in enumerate(self.followers, start=1)}
            ready = connection.wait(list(sentinels))
            if self._stopping.is_set():
                return
            rank = sentinels[cast(int, ready[0])]
            process = self.followers[rank - 1]
            process.join(timeout=1.0)
            log.error("tensor_parallel_follower_died", rank=rank, pid=process.pid,
                      exit_code=process.exitcode,
                      consequence="the group cannot continue; stopping")
            on_death(rank, process.exitcode)

        threading.Thread(target=run, name="tp-watchdog", daemon=True).start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Tells the followers to stop (from the thread that ran the engine, after its last
        step), waits for them, and leaves the process group."""
        self._stopping.set()
        if self.tp is not None and all(p.is_alive() for p in self.followers):
            self.tp.stop_followers()
        for process in self.followers:
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
        if dist.is_initialized():
            dist.destroy_process_group()


def start_group(spec: GroupSpec, on_death: Callable[[int, int | None], None]) -> Group:
    """Spawns the followers (watched from then on: `on_death`), joins the group as rank 0
    and loads the leader's shard into `Group.target`. Raises InvalidArgumentError before
    spawning anything when the target does not split `spec.world_size` ways."""
    check_shardable(TargetConfig.from_hf(read_config(Path(spec.target))), spec.world_size)
    port = spec.port or _free_port()
    context = mp.get_context("spawn")
    followers = [context.Process(target=_follower_main, args=(spec, rank, port, os.getpid()),
                                 name=f"tp-follower-{rank}", daemon=True)
                 for rank in range(1, spec.world_size)]
    for process in followers:
        process.start()
    group = Group(spec, followers)
    group.watch(on_death)
    try:
        group.tp = _join(spec, 0, port)
        group.target = load_target_shard(spec.target, torch.device(spec.devices[0]),
                                         spec.dtype, group.tp, spec.invariant)
    except BaseException:
        group.stop(timeout_s=0.0)
        raise
    return group


def _join(spec: GroupSpec, rank: int, port: int) -> TensorParallel:
    device = torch.device(spec.devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(spec.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=spec.world_size, timeout=RENDEZVOUS_TIMEOUT)
    control = dist.new_group(backend="gloo")  # every rank creates it, in the same order
    return TensorParallel(rank, spec.world_size, device, control)


def _follower_main(spec: GroupSpec, rank: int, port: int, leader_pid: int) -> None:
    """A follower process: join, load the shard, replay the leader until it says stop."""
    _exit_with_leader(leader_pid)
    tp = _join(spec, rank, port)
    target = load_target_shard(spec.target, tp.device, spec.dtype, tp, spec.invariant)
    follow(target, tp)
    dist.destroy_process_group()


def _exit_with_leader(leader_pid: int) -> None:
    """A follower whose leader died (even by SIGKILL) exits instead of waiting forever in
    a collective."""
    def run() -> None:
        while os.getppid() == leader_pid:
            threading.Event().wait(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=run, name="tp-leader-watch", daemon=True).start()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
