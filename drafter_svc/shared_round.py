"""The drafter's side of the shared draft link (the verifier's side:
verifier_svc/shared_drafter.py): a verifier on this host, on this GPU, shares its engine's
round state, and this process runs each round's draft half over it - the in-process
drafter's own code (`draft_into`, captured per shape as a CUDA graph), reading the
verifier's per-slot tables and writing the trees into the verifier's round buffers.
Nothing but a few bytes crosses the socket per round, and neither host waits for the
GPU: the order of the two processes' work is kept on the device by two shared CUDA
events.

Frames after the shared hello (ddtree/draft_socket.py framing), each answered in order:

- `{"op": "attach", ...}` (JSON): the verifier's device (its GPU's UUID), sizes, its
  tables (`ints`, `pending`), the staging rows of new contexts (`first`) and two events
  (`ready`: recorded by the verifier before each request that reads its state; `done`:
  recorded here after the work, which the verifier's stream waits on). On the CPU the
  tensors' file descriptors follow the frame (draft_socket.send_fds) and there are no
  events: the work is done before the answer. A pool of the verifier's slots is
  allocated here (its rows are the verifier's slots).
- `{"op": "buffers", "batch": B, "num_nodes": N, "tensors": ...}` (JSON): one round
  shape's buffers, shared once before its first draft.
- `{"op": "start", "slot": s, "num_rows": P, "offset": o}` (JSON): the first `P` rows of
  `first` are the features of slot `s`'s context at positions o.. (a new row's prompt).
- `D` + two little-endian uint32 (B, N): the draft half of a round of that shape.

The answer is `k` or a JSON object with an `error`; an error in `attach` ends the link
(the verifier then takes the Draft stream), a failed request ends it too (its state is
no longer known). The link lives as long as the connection: a verifier that reconnects
attaches again.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import structlog
import torch

from ddtree import draft_socket, shared_tensors
from ddtree.draft_socket import FrameError
from ddtree.engine.drafting import LocalDrafter
from ddtree.engine.graphs import GraphRunner
from ddtree.engine.round import RoundBuffers, draft_into
from ddtree.engine.state import SlotState
from ddtree.round_trace import RoundTrace
from ddtree.shared_tensors import SharingError

log = structlog.get_logger("drafter_svc.shared_round")

OK, DRAFT = draft_socket.SHARED_OK, draft_socket.SHARED_DRAFT
SETUP_TIMEOUT_S = 30.0  # an attach or buffers frame's descriptors arrive within this
SEND_TIMEOUT_S = 30.0


class SharedRoundLink:
    """One verifier's shared draft link over `conn` (after its hello), served by the
    connection's thread until it closes."""

    def __init__(self, conn: socket.socket, template: LocalDrafter, lock: threading.Lock,
                 max_slots: int, max_model_len: int, context_graphs: bool,
                 stopping: threading.Event) -> None:
        self.conn = conn
        self.template = template
        self.lock = lock  # the service's model: one stream's work at a time
        self.max_slots = max_slots
        self.max_model_len = max_model_len
        self.context_graphs = context_graphs
        self.stopping = stopping
        self.device = template.embeddings.embed_tokens.weight.device
        self.local: LocalDrafter | None = None
        self.state: SlotState | None = None
        self.first: torch.Tensor | None = None
        self.ready: torch.cuda.Event | None = None
        self.done: torch.cuda.Event | None = None
        self.stream: torch.cuda.Stream | None = None  # with the events: where work goes
        self.buffers: dict[tuple[int, int], RoundBuffers] = {}
        self.graphs = GraphRunner(self.device, True)
        self.trace = RoundTrace("drafter")  # DDTREE_TRACE_DIR: a profiler window

    def serve(self, peer: str) -> None:
        failed = False
        while not failed:
            frame = draft_socket.recv_frame(self.conn, None, self.stopping)
            try:
                self._handle(frame)
                answer = OK
            except (SharingError, ValueError, KeyError, IndexError, TypeError, AttributeError,
                    RuntimeError) as exc:  # a malformed request ends only this link
                log.warning("shared_draft_failed", peer=peer, error=str(exc))
                answer, failed = json.dumps({"error": str(exc)}).encode(), True
            self.conn.settimeout(SEND_TIMEOUT_S)
            draft_socket.send_frame(self.conn, answer)

    def _handle(self, frame: bytes) -> None:
        if frame[:1] == b"D":
            if len(frame) != DRAFT.size:
                raise ValueError("malformed draft frame")
            _, batch, num_nodes = DRAFT.unpack(frame)
            self._draft(batch, num_nodes)
            return
        message = json.loads(frame)
        if not isinstance(message, dict):
            raise ValueError("a frame is a JSON object or a draft frame")
        fds = draft_socket.recv_fds(self.conn, int(message.get("num_fds", 0)),
                                    time.monotonic() + SETUP_TIMEOUT_S)
        op = message.get("op")
        if op == "attach":
            self._attach(message, fds)
        elif op == "buffers":
            self._share_buffers(message, fds)
        elif op == "start":
            self._start(int(message["slot"]), int(message["num_rows"]), int(message["offset"]))
        else:
            raise ValueError(f"unknown op {op!r}")

    def _attach(self, message: dict[str, Any], fds: list[int]) -> None:
        if self.local is not None:
            raise ValueError("the link is attached already")
        mine = shared_tensors.device_uuid(self.device)
        if message["device_uuid"] != mine:
            raise SharingError(f"the verifier's device {message['device_uuid']} is not this "
                               f"drafter's ({mine})")
        template = self.template
        if (int(message["block_size"]), tuple(message["target_layer_ids"])) != (
                template.block_size, template.target_layer_ids):
            raise ValueError("the verifier expects another drafter (block size or layers)")
        num_slots, max_len = int(message["num_slots"]), int(message["max_model_len"])
        if not 0 < num_slots <= self.max_slots:
            raise ValueError(f"{num_slots} rows exceed this drafter's {self.max_slots} sessions")
        if not 0 < max_len <= self.max_model_len:
            raise ValueError(f"max_model_len {max_len} exceeds this drafter's "
                             f"{self.max_model_len}")
        tensors = {name: shared_tensors.open_tensor(d, fds, self.device)
                   for name, d in message["tensors"].items()}
        ints, pending, first = tensors["ints"], tensors["pending"], tensors["first"]
        if ints.shape != (num_slots + 1, ints.shape[1]) or pending.shape[:2] != (
                num_slots + 1, template.block_size) or first.shape[1] != pending.shape[2]:
            raise ValueError("the shared tables' shapes do not fit")
        self.ready = shared_tensors.open_event(message["events"]["ready"], self.device)
        self.done = shared_tensors.open_event(message["events"]["done"], self.device)
        if self.done is not None:  # this connection's thread's stream, for every request
            self.stream = torch.cuda.current_stream(self.device)
        with self.lock:
            local = template.sibling(num_slots, max_len, self.context_graphs)
            local.context.warm_up()
        self.state = SlotState.over(ints, pending)
        self.first = first
        self.local = local
        log.info("shared_draft_attached", num_slots=num_slots, max_model_len=max_len,
                 device=str(self.device))

    def _share_buffers(self, message: dict[str, Any], fds: list[int]) -> None:
        if self.local is None:
            raise ValueError("not attached")
        key = (int(message["batch"]), int(message["num_nodes"]))
        tensors = {name: shared_tensors.open_tensor(d, fds, self.device)
                   for name, d in message["tensors"].items()}
        buffers = RoundBuffers.over(width=self.local.block_size, **tensors)
        if (buffers.batch, buffers.num_nodes) != key:
            raise ValueError("the shared buffers' shapes do not fit")
        self.buffers[key] = buffers

    def _start(self, slot: int, num_rows: int, offset: int) -> None:
        local, first = self.local, self.first
        if local is None or first is None or self.state is None:
            raise ValueError("not attached")
        if not (0 <= slot < self.state.num_slots and 0 < num_rows <= first.shape[0]
                and 0 <= offset and offset + num_rows <= self.max_model_len):
            raise ValueError("start out of range")
        with self.lock, torch.inference_mode():
            self._wait_ready()
            local.start(slot, "", first[:num_rows], offset)
            self._record_done()

    def _draft(self, batch: int, num_nodes: int) -> None:
        buffers = self.buffers.get((batch, num_nodes))
        local, state = self.local, self.state
        if buffers is None or local is None or state is None:
            raise ValueError(f"no shared buffers of shape ({batch}, {num_nodes})")
        key = ("draft", batch, num_nodes)

        def half() -> None:
            draft_into(state, local, buffers)

        self.trace.tick()
        with self.lock, torch.inference_mode():
            self._wait_ready()
            if self.graphs.enabled and key not in self.graphs:
                # The warm-up runs really execute on the rows the verifier asked for: the
                # draft half is idempotent (it rewrites the same context and trees).
                self.graphs.capture(key, half)
            self.graphs.run(key, half)
            self._record_done()

    def _wait_ready(self) -> None:
        if self.ready is not None and self.stream is not None:
            self.stream.wait_event(self.ready)

    def _record_done(self) -> None:
        if self.done is not None and self.stream is not None:
            self.done.record(self.stream)


def serve_shared(conn: socket.socket, peer: str, link: SharedRoundLink) -> None:
    """Serves a shared link until its connection ends (errors are logged)."""
    try:
        link.serve(peer)
    except (OSError, FrameError) as exc:
        log.info("shared_draft_closed", peer=peer, reason=str(exc))
