"""What a hop between two processes' GPU work costs on one GPU: the shared draft link's
ordering (verifier_svc/shared_drafter.py) in isolation.

Process A enqueues a kernel, records `ready` and tells process B over a pipe; B waits
for `ready`, runs its kernel, records `done` and answers; A waits for `done`. Each side
waits either on the device (`gpu`: its stream waits on the other's event, the host goes
on) or on the host (`host`: the host synchronizes the other's event, then enqueues); mode
`spin` uses no event: each side's stream runs a one-program kernel that polls an int32
flag in device memory shared over CUDA IPC until the other side's release store (a
one-program kernel after its work) reaches this iteration. A spinning kernel holds an SM
while the other process's kernels run, so it only makes sense where two processes' kernels
run at once (an MPS server); without one it waits out time slices (it gives up after
SPIN_LIMIT polls, and the row says so). Mode `memop` waits and writes the same flags with
the driver's stream memory operations (cuStreamWaitValue32 / cuStreamWriteValue32: the
GPU's front end polls, no SM is held); `hostmemop` the same on flags in pinned shared host
memory (registered in both processes: memory no process owns, which a host can write to
release a wait whose writer died). A reads iteration i-1's end while iteration i runs
(pipelined by one, as the engine is). Printed: microseconds per iteration against the same
two kernels on one stream in one process, for several kernel lengths (torch.cuda._sleep).
Run on the GPU host (under an MPS server: CUDA_MPS_PIPE_DIRECTORY set, the daemon up):

    python3 scripts/gpu/ipc_hop_bench.py [--iters 2000] [--modes gpu/gpu,gpu/host,...,spin,memop]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import time
from multiprocessing.connection import Connection

import torch
import torch.multiprocessing  # noqa: F401  (CUDA tensors through a pipe: IPC handles)
import triton
import triton.language as tl

# (A's, B's) kernel lengths in cycles: ~0, ~50 us each, ~200 us each, ~600 / ~200 us at
# the H200's clock (a c1 round's verify and draft halves are of the last order)
SLEEP_CYCLES = ((0, 0), (100_000, 100_000), (400_000, 400_000), (1_200_000, 400_000))
MODES = ("gpu/gpu", "gpu/host", "host/gpu", "host/host", "spin", "memop",
         "hostmemop")  # A's wait / B's wait, or both sides' flag waits
FLAG_MODES = ("spin", "memop", "hostmemop")
SPIN_LIMIT = 1 << 22  # polls before a spinning kernel gives up (a few seconds)


@triton.jit(do_not_specialize=["target"])
def _spin_until_kernel(flag_ptr, target, limit, gave_up_ptr):
    """Poll flag_ptr (acquire, system scope) until it reaches target or `limit` polls."""
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    polls = 0
    while (seen < target) & (polls < limit):
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        polls += 1
    tl.atomic_add(gave_up_ptr, (seen < target).to(tl.int32))


@triton.jit(do_not_specialize=["value"])
def _signal_kernel(flag_ptr, value):
    """The flag := value, released at system scope after this stream's earlier work."""
    tl.atomic_xchg(flag_ptr, value, sem="release", scope="sys")


def spin_until(flag: torch.Tensor, target: int, gave_up: torch.Tensor) -> None:
    _spin_until_kernel[(1,)](flag, target, SPIN_LIMIT, gave_up, num_warps=1)


def signal(flag: torch.Tensor, value: int) -> None:
    _signal_kernel[(1,)](flag, value, num_warps=1)


_DRIVER: list[ctypes.CDLL] = []


def _driver() -> ctypes.CDLL:
    if not _DRIVER:
        _DRIVER.append(ctypes.CDLL("libcuda.so.1"))
    return _DRIVER[0]


def memop_wait(address: int, value: int) -> None:
    """This stream waits until the int32 at `address` >= value (CU_STREAM_WAIT_VALUE_GEQ)."""
    stream = torch.cuda.current_stream().cuda_stream
    err = _driver().cuStreamWaitValue32_v2(ctypes.c_void_p(stream), ctypes.c_uint64(address),
                                           ctypes.c_uint32(value), ctypes.c_uint(0))
    assert err == 0, f"cuStreamWaitValue32: CUresult {err}"


def memop_write(address: int, value: int) -> None:
    """The int32 at `address` := value once this stream's earlier work is done."""
    stream = torch.cuda.current_stream().cuda_stream
    err = _driver().cuStreamWriteValue32_v2(ctypes.c_void_p(stream), ctypes.c_uint64(address),
                                            ctypes.c_uint32(value), ctypes.c_uint(0))
    assert err == 0, f"cuStreamWriteValue32: CUresult {err}"


def mapped_address(host: torch.Tensor) -> int:
    """The device address of a shared host tensor, registered (mapped) in this process."""
    nbytes = host.numel() * host.element_size()
    err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, 2)  # Mapped
    assert int(err) == 0, f"cudaHostRegister: {err}"
    address = ctypes.c_uint64()
    err = _driver().cuMemHostGetDevicePointer_v2(ctypes.byref(address),
                                                 ctypes.c_void_p(host.data_ptr()), 0)
    assert err == 0, f"cuMemHostGetDevicePointer: CUresult {err}"
    return address.value


class Flags:
    """The two flags [ready, done] of one process: device memory shared over CUDA IPC
    (`device`) and pinned shared host memory (`host`, at `host_address` on the device)."""

    def __init__(self, device: torch.Tensor, host: torch.Tensor,
                 gave_up: torch.Tensor) -> None:
        self.device, self.host, self.gave_up = device, host, gave_up
        self.host_address = mapped_address(host)

    def wait(self, mode: str, which: int, value: int) -> None:
        if mode == "spin":
            spin_until(self.device[which:which + 1], value, self.gave_up)
        elif mode == "memop":
            memop_wait(self.device[which:which + 1].data_ptr(), value)
        else:
            memop_wait(self.host_address + 4 * which, value)

    def set(self, mode: str, which: int, value: int) -> None:
        if mode == "spin":
            signal(self.device[which:which + 1], value)
        elif mode == "memop":
            memop_write(self.device[which:which + 1].data_ptr(), value)
        else:
            memop_write(self.host_address + 4 * which, value)


def _work(cycles: int, scratch: torch.Tensor) -> None:
    if cycles:
        torch.cuda._sleep(cycles)
    else:
        scratch.add_(1)


def peer(conn: Connection) -> None:
    ready_handle, done_handle, device_flags, host_flags, gave_up = conn.recv()
    flags = Flags(device_flags, host_flags, gave_up)
    device = torch.device("cuda", 0)
    ready = torch.cuda.Event.from_ipc_handle(device, ready_handle)
    done = torch.cuda.Event.from_ipc_handle(device, done_handle)
    stream = torch.cuda.current_stream(device)
    scratch = torch.zeros(1, device=device)
    while True:
        message = conn.recv()
        if message is None:
            return
        cycles, wait, iteration = message
        if wait in FLAG_MODES:
            flags.wait(wait, 0, iteration)
        elif wait == "host":
            ready.synchronize()
        else:
            stream.wait_event(ready)
        _work(cycles, scratch)
        if wait in FLAG_MODES:
            flags.set(wait, 1, iteration)
        else:
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
    host_flags = torch.zeros(2, dtype=torch.int32).share_memory_()
    link = Link(mine, ready, done, Flags(torch.zeros(2, dtype=torch.int32, device="cuda"),
                                         host_flags,
                                         torch.zeros(1, dtype=torch.int32, device="cuda")))
    mine.send((ready.ipc_handle(), done.ipc_handle(), link.flags.device, host_flags,
               link.flags.gave_up))
    print("cycles A/B       mode       one process us/iter  two processes us/iter  hop pair us"
          "  spins given up")
    for cycles in SLEEP_CYCLES:
        one_process(cycles, 50)
        single = one_process(cycles, args.iters)
        for mode in args.modes.split(","):
            waits = (mode, mode) if mode in FLAG_MODES else tuple(mode.split("/"))
            link.flags.gave_up.zero_()
            _pair(link, cycles, 50, waits)
            pair = _pair(link, cycles, args.iters, waits)
            label = f"{cycles[0]}/{cycles[1]}"
            print(f"{label:>17}  {mode:>9}  {single:>19.1f}  {pair:>21.1f}  {pair - single:>11.1f}"
                  f"  {int(link.flags.gave_up.item()):>14}", flush=True)
    mine.send(None)
    process.join()


class Link:
    """A's ends of the hop: the pipe, both events and the flags."""

    def __init__(self, conn: Connection, ready: torch.cuda.Event, done: torch.cuda.Event,
                 flags: Flags) -> None:
        self.conn, self.ready, self.done, self.flags = conn, ready, done, flags
        self.iteration = 0  # the flags only grow: every call goes on counting


def _pair(link: Link, cycles: tuple[int, int], iters: int, waits: tuple[str, ...]) -> float:
    stream = torch.cuda.current_stream()
    scratch = torch.zeros(1, device="cuda")
    marks: list[torch.cuda.Event] = []
    a_wait, b_wait = waits
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        link.iteration += 1
        _work(cycles[0], scratch)
        if b_wait in FLAG_MODES:
            link.flags.set(b_wait, 0, link.iteration)
        else:
            link.ready.record(stream)
        link.conn.send((cycles[1], b_wait, link.iteration))
        link.conn.recv()
        if a_wait in FLAG_MODES:
            link.flags.wait(a_wait, 1, link.iteration)
        elif a_wait == "host":
            link.done.synchronize()
        else:
            stream.wait_event(link.done)
        mark = torch.cuda.Event()
        mark.record(stream)
        marks.append(mark)
        if len(marks) >= 2:
            marks.pop(0).synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters * 1e6


if __name__ == "__main__":
    main()
