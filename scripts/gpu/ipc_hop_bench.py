"""What a hop between two processes' GPU work costs on one GPU: the shared draft link's
ordering (verifier_svc/shared_drafter.py) in isolation.

Process A enqueues a kernel, records `ready` and tells process B over a pipe; B's stream
waits on `ready`, runs its kernel, records `done` and answers; A's stream waits on `done`.
A reads iteration i-1's end while iteration i runs (pipelined by one, as the engine is).
Printed: microseconds per iteration against the same two kernels on one stream in one
process, for several kernel lengths (torch.cuda._sleep). Run on the GPU host:

    python3 scripts/gpu/ipc_hop_bench.py [--iters 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from multiprocessing.connection import Connection

import torch

SLEEP_CYCLES = (0, 100_000, 400_000)  # ~0, ~50, ~200 us at the H200's clock


def peer(conn: Connection) -> None:
    ready_handle, done_handle = conn.recv()
    device = torch.device("cuda", 0)
    ready = torch.cuda.Event.from_ipc_handle(device, ready_handle)
    done = torch.cuda.Event.from_ipc_handle(device, done_handle)
    stream = torch.cuda.current_stream(device)
    while True:
        message = conn.recv()
        if message is None:
            return
        stream.wait_event(ready)
        if message:
            torch.cuda._sleep(message)
        else:
            torch.empty(1, device=device).add_(1)
        done.record(stream)
        conn.send(True)


def one_process(cycles: int, iters: int) -> float:
    scratch = torch.zeros(1, device="cuda")
    marks: list[torch.cuda.Event] = []
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        for _ in range(2):
            if cycles:
                torch.cuda._sleep(cycles)
            else:
                scratch.add_(1)
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
    args = parser.parse_args()
    torch.cuda.init()
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    process = ctx.Process(target=peer, args=(theirs,))
    process.start()
    ready = torch.cuda.Event(interprocess=True)
    done = torch.cuda.Event(interprocess=True)
    mine.send((ready.ipc_handle(), done.ipc_handle()))
    print("cycles  one process us/iter  two processes us/iter  hop pair us")
    for cycles in SLEEP_CYCLES:
        one_process(cycles, 50)
        single = one_process(cycles, args.iters)
        pair = _pair(mine, ready, done, cycles, args.iters)
        print(f"{cycles:>7}  {single:>19.1f}  {pair:>21.1f}  {pair - single:>11.1f}")
    mine.send(None)
    process.join()


def _pair(conn: Connection, ready: torch.cuda.Event, done: torch.cuda.Event, cycles: int,
          iters: int) -> float:
    stream = torch.cuda.current_stream()
    scratch = torch.zeros(1, device="cuda")
    marks: list[torch.cuda.Event] = []
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        if cycles:
            torch.cuda._sleep(cycles)
        else:
            scratch.add_(1)
        ready.record(stream)
        conn.send(cycles)
        conn.recv()
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
