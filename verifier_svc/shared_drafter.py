"""The verifier's side of the shared draft link (the drafter's: drafter_svc/shared_round.py):
with the drafter service on this host and this GPU, the engine shares its round state
with it - its per-slot tables, its round buffers and two CUDA events - and each round's
draft half runs there over that state, as the in-process drafter's graph would here.

A round then sends the drafter 9 bytes and reads 1 back: no features leave the device,
no trees come through the host, and the engine pipelines its rounds as with the
in-process drafter (the next round is launched before the host reads the last). On the
device the order is kept by the events: the verifier records `ready` after the work
the draft reads, the drafter's stream waits on it, runs the draft half and records
`done`, which the verifier's stream waits on before the verify. Neither host waits for
the GPU. Through the Draft stream a round's exchange was in series with the verify and
both hosts' work (lease 29: ~1 ms of reply wait and ~2 ms of host work a c8 round).

The drafter writes into this process's buffers: the link is for a drafter service the
operator runs beside the verifier (same host, same user: the socket is 0600, the hello
carries the instance id and the token), trusted as the in-process drafter is.

Used when the drafter advertises a local socket and accepts the link (same GPU, CUDA
IPC available; on the CPU, shared memory); otherwise the engine drafts over the Draft
stream (`RemoteDrafter`). A link that breaks fails its round: the rows of that round
continue in ar (the drafter's copy of their context is gone), and the link is attached
again, to whatever drafter then answers, for the rows that come after.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import structlog
import torch
from torch import Tensor

from ddtree import draft_socket, shared_tensors
from ddtree.engine.drafting import DeviceDrafting
from ddtree.engine.round import RoundBuffers
from ddtree.shared_tensors import SharingError
from ddtree.v1 import drafter_pb2
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import DEADLINE_FACTOR, EMA_WEIGHT, MIN_DEADLINE_S

if TYPE_CHECKING:
    from ddtree.engine.core import Engine

log = structlog.get_logger("verifier_svc.shared_drafter")

# Rows of a new context's features staged for the drafter at once (longer prompts go
# in several starts).
FIRST_ROWS = 2048
# A link that failed is attached again at most this often.
REATTACH_INTERVAL_S = 2.0
# A new row's start may take this long at least (on the CPU the drafter stores the
# context before it answers).
MIN_START_S = 2.0


class LinkFailed(Exception):
    """The link broke, timed out or the drafter refused a request."""


class SharedDrafter(DeviceDrafting):
    def __init__(self, client: DrafterClient, info: drafter_pb2.DrafterInfo,
                 timeout_s: float, new_shape_timeout_s: float) -> None:
        self.client = client
        self.block_size = info.block_size
        self.target_layer_ids = tuple(info.target_layer_ids)
        self.timeout_s = timeout_s
        self.new_shape_timeout_s = new_shape_timeout_s
        self._engine: weakref.ref[Engine] | None = None  # no cycle: a dropped engine
        # frees this link (its socket closes and the drafter frees the link's pool)
        self._sock: socket.socket | None = None
        self._instance = ""  # the drafter process the link is attached to
        self._shared: set[tuple[int, int]] = set()  # buffer shapes the drafter opened
        self._drafted: set[tuple[int, int]] = set()  # shapes it has drafted (captured)
        # Attaches so far; the one each slot's context was stored under (a row whose
        # context an earlier link holds is unknown to this one).
        self._generation = 0
        self._row_generation: dict[int, int] = {}
        self._last_try = 0.0
        self._attaching = False  # an attach runs in the background
        self._lock = threading.Lock()
        client.add_connect_listener(self._attach_later)  # a drafter back: attach again
        self._round_trip_s: float | None = None  # moving average of a draft's answer
        self._first: Tensor | None = None
        self._ready: torch.cuda.Event | None = None
        self._done: torch.cuda.Event | None = None

    @property
    def linked(self) -> bool:
        return self._sock is not None

    @property
    def available(self) -> bool:
        """Attached to a drafter (new rows draft only then). A link that failed is
        attached again in the background (the engine thread never waits for it): when
        the client connects to a drafter again, or from here at most every
        REATTACH_INTERVAL_S while the client sees one."""
        if self._sock is None and time.monotonic() - self._last_try >= REATTACH_INTERVAL_S:
            self._attach_later()
        return self._sock is not None

    def _attach_later(self, info: drafter_pb2.DrafterInfo | None = None) -> None:
        engine = self._engine() if self._engine is not None else None
        with self._lock:
            if (self._sock is not None or engine is None or self._attaching
                    or self.client.info is None):
                return
            self._attaching = True
            self._last_try = time.monotonic()
        threading.Thread(target=self._attach_in_background, args=(engine,),
                         name="shared-draft-attach", daemon=True).start()

    def attach(self, engine: Any) -> None:
        """Opens the link to the drafter the client is connected to and shares the
        engine's tables (at the engine's construction); on failure the link stays closed
        (logged) and `available` tries again later."""
        self._engine = weakref.ref(engine)
        self._last_try = time.monotonic()
        state, device = engine.state, engine.device
        if self._first is None:
            width = state.pending.shape[2]
            self._first = torch.zeros(FIRST_ROWS, width, dtype=state.pending.dtype,
                                      device=device)
            self._ready = shared_tensors.new_event(device)
            self._done = shared_tensors.new_event(device)
        message, fds = self._attach_message(engine)  # on the CPU: the tables now shared
        self._connect(message, fds)

    def _attach_message(self, engine: Any) -> tuple[dict[str, Any], list[int]]:
        state, device = engine.state, engine.device
        assert self._first is not None
        fds: list[int] = []
        message = {
            "op": "attach", "device_uuid": shared_tensors.device_uuid(device),
            "num_slots": state.num_slots, "max_model_len": engine.max_model_len,
            "block_size": self.block_size, "target_layer_ids": list(self.target_layer_ids),
            "tensors": {"ints": shared_tensors.export(state.ints, fds),
                        "pending": shared_tensors.export(state.pending, fds),
                        "first": shared_tensors.export(self._first, fds)},
            "events": {"ready": shared_tensors.export_event(self._ready),
                       "done": shared_tensors.export_event(self._done)},
        }
        return message, fds

    def _attach_in_background(self, engine: Any) -> None:
        try:
            self._connect(*self._attach_message(engine))
        finally:
            with self._lock:
                self._attaching = False

    def _connect(self, message: dict[str, Any], fds: list[int]) -> None:
        info = self.client.info
        if info is None or not info.local_socket:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        timeout = self.client.connect_timeout_s
        try:
            sock.settimeout(timeout)
            sock.connect(info.local_socket)
            draft_socket.send_frame(sock, draft_socket.hello(
                info.instance_id, self.client.token, draft_socket.SHARED_PREFIX))
            if draft_socket.recv_frame(sock, time.monotonic() + timeout) != draft_socket.HELLO_OK:
                raise LinkFailed("hello refused")
            # the drafter captures its first contexts' graphs before answering
            _exchange(sock, message, fds, self.new_shape_timeout_s)
        except (OSError, draft_socket.FrameError, LinkFailed, SharingError) as exc:
            sock.close()
            log.info("shared_draft_unavailable", reason=str(exc))
            return
        self._instance = info.instance_id
        self._shared.clear()
        self._drafted.clear()
        self._generation += 1
        self._sock = sock  # last: the engine thread takes the link from here on
        log.info("shared_draft_attached", socket=info.local_socket,
                 num_slots=message["num_slots"])

    def _deadline_s(self, shape: tuple[int, int] | None) -> float:
        """How long an answer may take: a shape the drafter has not drafted yet captures
        its graph first (new_shape_timeout_s); otherwise a multiple of the recent
        answers (the drafter answers once it has enqueued its work on a GPU), within
        bounds, so that a drafter that hangs costs one short wait."""
        if (shape is not None and shape not in self._drafted) or self._round_trip_s is None:
            return self.new_shape_timeout_s
        return min(self.timeout_s, max(MIN_DEADLINE_S, DEADLINE_FACTOR * self._round_trip_s))

    def start(self, slot: int, request_id: str, features: Tensor) -> None:
        """features: (P, k*H) the new row's prompt features on the device, staged in the
        shared rows and stored by the drafter as its first context."""
        first = self._first
        self._row_generation.pop(slot, None)
        if self._sock is None or first is None:
            return  # the row stops drafting before its first round (`unknown`)
        try:
            for offset in range(0, features.shape[0], first.shape[0]):
                part = features[offset: offset + first.shape[0]]
                first[: part.shape[0]].copy_(part)
                self._call({"op": "start", "slot": slot, "num_rows": part.shape[0],
                            "offset": offset}, max(MIN_START_S, self._deadline_s(None)))
        except LinkFailed as exc:
            self._lose(str(exc))
            return
        self._row_generation[slot] = self._generation

    def unknown(self, slots: list[int]) -> list[int]:
        """The slots whose context this link's drafter does not hold (stored under a link
        that broke since, or never stored)."""
        return [slot for slot in slots if self._row_generation.get(slot) != self._generation]

    def draft(self, buffers: RoundBuffers) -> bool:
        shape = (buffers.batch, buffers.num_nodes)
        if self._sock is None:
            return False
        try:
            if shape not in self._shared:
                fds: list[int] = []
                tensors = {name: shared_tensors.export(t, fds)
                           for name, t in buffers.tree_tensors().items()}
                self._request({"op": "buffers", "batch": shape[0], "num_nodes": shape[1],
                               "tensors": tensors}, fds, self.timeout_s)
                self._shared.add(shape)
            started = time.perf_counter()
            self._call(draft_socket.SHARED_DRAFT.pack(b"D", *shape), self._deadline_s(shape))
            if shape in self._drafted:  # a shape's first answer includes its capture
                elapsed = time.perf_counter() - started
                self._round_trip_s = elapsed if self._round_trip_s is None else (
                    (1 - EMA_WEIGHT) * self._round_trip_s + EMA_WEIGHT * elapsed)
        except (LinkFailed, SharingError) as exc:
            self._lose(str(exc))  # the round's rows stop drafting (and are unknown anyway)
            return False
        self._drafted.add(shape)
        return True

    def _call(self, message: dict[str, Any] | bytes, timeout_s: float) -> None:
        """Records `ready`, sends the request, waits for its answer and makes this
        process's stream wait on `done` (the drafter's work)."""
        if self._ready is not None:
            self._ready.record()
        self._request(message, [], timeout_s)
        if self._done is not None:
            torch.cuda.current_stream().wait_event(self._done)

    def _request(self, message: dict[str, Any] | bytes, fds: list[int],
                 timeout_s: float) -> None:
        sock = self._sock
        if sock is None:
            raise LinkFailed("not attached")
        _exchange(sock, message, fds, timeout_s)

    def close(self) -> None:
        """Ends the link for good (the drafter frees its pool for it)."""
        self._engine = None  # nothing to attach again
        self.client.remove_connect_listener(self._attach_later)
        if self._sock is not None:
            self._sock.close()
        self._sock = None

    def _lose(self, reason: str) -> None:
        """The link is gone: the rows drafting now stop in their next round; the client
        looks the drafter up again (it may have restarted)."""
        log.warning("shared_draft_lost", reason=reason)
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self.client.reset(reason)


def _exchange(sock: socket.socket, message: dict[str, Any] | bytes, fds: list[int],
              timeout_s: float) -> None:
    """Sends a request (a JSON object, with `fds` after it, or a draft frame) and reads
    its answer; LinkFailed when the link broke, timed out or the drafter refused."""
    if isinstance(message, dict):
        message = json.dumps({**message, "num_fds": len(fds)}).encode()
    try:
        sock.settimeout(timeout_s)
        draft_socket.send_frame(sock, message)
        draft_socket.send_fds(sock, fds)
        answer = draft_socket.recv_frame(sock, time.monotonic() + timeout_s)
    except (OSError, draft_socket.FrameError) as exc:
        raise LinkFailed(f"shared draft link: {exc}") from exc
    if answer != draft_socket.SHARED_OK:
        try:
            error = json.loads(answer).get("error", "")
        except (ValueError, AttributeError):
            error = repr(answer[:80])
        raise LinkFailed(f"the drafter refused: {error}")
