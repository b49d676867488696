"""What a hop between two processes' GPU work costs on one GPU: the shared draft link's
ordering (verifier_svc/shared_drafter.py) in isolation.

Process A enqueues a kernel, records `ready` and tells process B over a pipe; B waits
for `ready`, runs its kernel, records `done` and answers; A waits for `done`. Each side
waits either on the device (`gpu`: its stream waits on the other's event, the host goes
on) or on the host (`host`: the host synchronizes the other's event, then enqueues). A
reads iteration i-1's end while iteration i runs (pipelined by one, as the engine is).
Printed: microseconds per iteration against the same two kernels on one stream in one
process, for several kernel lengths (torch.cuda._sleep). Run on the GPU host:

    python3 scripts/gpu/ipc_hop_bench.py [--iters 2000] [--modes gpu/gpu,gpu/host,...]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from multiprocessing.connection import Connection

import torch

# (A's, B's) kernel lengths in cycles: ~0, ~50 us each, ~200 us each, ~600 / ~200 us at
# the H200's clock (a c1 round's verify and draft halves are of the last order)
SLEEP_CYCLES = ((0, 0), (100_000, 100_000), (400_000, 400_000), (1_200_000, 400_000))
MODES = ("gpu/gpu", "gpu/host", "host/gpu", "host/host")  # A's wait / B's wait


def _work(cycles: int, scratch: torch.Tensor) -> None:
    if cycles:
        torch.cuda._sleep(cycles)
    else:
        scratch.add_(1)


def peer(conn: Connection) -> None:
    ready_handle, done_handle = conn.recv()
    device = torch.device("cuda", 0)
    ready = torch.cuda.Event.from_ipc_handle(device, ready_handle)
    done = torch.cuda.Event.from_ipc_handle(device, done_handle)
    stream = torch.cuda.current_stream(device)
    scratch = torch.zeros(1, device=device)
    while True:
        message = conn.recv()
        if message is None:
            return
        cycles, host_wait = message
        if host_wait:
            ready.synchronize()
        else:
            stream.wait_event(ready)
        _work(cycles, scratch)
        done.record(stream)
        conn.send(True)


def one_process(cycles: tuple[int, int], iters: int) -> float:
    scratch = torch.zeros(1, device="cuda")
    marks: list[torch.cuda.Event] = []
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        for side in cycles:
            _work(side, scratch)
        mark = torch.cuda.Event()
        mark.record()
        marks.append(mark)
        if len(marks) >= 2:
            marks.pop(0).synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    torch.cuda.init()
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    process = ctx.Process(target=peer, args=(theirs,))
    process.start()
    ready = torch.cuda.Event(interprocess=True)
    done = torch.cuda.Event(interprocess=True)
    mine.send((ready.ipc_handle(), done.ipc_handle()))
    print("cycles A/B       mode       one process us/iter  two processes us/iter  hop pair us")
    for cycles in SLEEP_CYCLES:
        one_process(cycles, 50)
        single = one_process(cycles, args.iters)
        for mode in args.modes.split(","):
            a_host, b_host = (side == "host" for side in mode.split("/"))
            _pair(mine, ready, done, cycles, 50, a_host, b_host)
            pair = _pair(mine, ready, done, cycles, args.iters, a_host, b_host)
            label = f"{cycles[0]}/{cycles[1]}"
            print(f"{label:>17}  {mode:>9}  {single:>19.1f}  {pair:>21.1f}  {pair - single:>11.1f}",
                  flush=True)
    mine.send(None)
    process.join()


def _pair(conn: Connection, ready: torch.cuda.Event, done: torch.cuda.Event,
          cycles: tuple[int, int], iters: int, a_host: bool, b_host: bool) -> float:
    stream = torch.cuda.current_stream()
    scratch = torch.zeros(1, device="cuda")
    marks: list[torch.cuda.Event] = []
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        _work(cycles[0], scratch)
        ready.record(stream)
        conn.send((cycles[1], b_host))
        conn.recv()
        if a_host:
            done.synchronize()
        else:
            stream.wait_event(done)
        mark = torch.cuda.Event()
        mark.record(stream)
        marks.append(mark)
        if len(marks) >= 2:
            marks.pop(0).synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters * 1e6


if __name__ == "__main__":
    main()
