"""The drafter's Draft stream on a Unix socket (framing and hello: ddtree/draft_socket.py).

Each connection is one Draft stream, answered by the same servicer code as the gRPC
stream (`DrafterServicer.serve_stream`) on a thread of its own, which reads a request,
drafts and writes the reply itself: no hand-off between threads. At most `max_streams`
connections at once (`draft_socket.FrameServer`), as the gRPC server bounds its streams.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass

from ddtree import draft_socket
from ddtree.engine.drafting import LocalDrafter
from ddtree.v1 import drafter_pb2
from drafter_svc.servicer import DrafterServicer
from drafter_svc.shared_round import SharedRoundLink, serve_shared

SEND_TIMEOUT_S = 30.0  # a reply the verifier does not read this long ends its connection



class LocalDraftServer(draft_socket.FrameServer):
    def __init__(self, path: str, servicer: DrafterServicer, instance_id: str, token: str,
                 max_streams: int, shared: SharedLinks | None = None) -> None:
        """shared: what a shared draft link needs (None: such hellos are refused)."""
        super().__init__(path, instance_id, token, max_streams,
                         (draft_socket.HELLO_PREFIX, draft_socket.SHARED_PREFIX), "draft_socket")
        self.servicer = servicer
        self.max_streams = max_streams
        self.shared = shared

    def admits(self, prefix: bytes) -> str:
        if prefix == draft_socket.SHARED_PREFIX and self.shared is None:
            return "shared draft is off"
        return ""

    def serve(self, conn: socket.socket, peer: str, prefix: bytes) -> None:
        if prefix == draft_socket.SHARED_PREFIX:
            assert self.shared is not None
            serve_shared(conn, peer, self.shared.link(conn, self.stopping))
            return
        # closing: the stream's sessions are freed at once, also when a send fails
        requests = self.messages(conn, peer, drafter_pb2.DraftRequest)
        with contextlib.closing(self.servicer.serve_stream(requests, peer)) as replies:
            for reply in replies:
                conn.settimeout(SEND_TIMEOUT_S)
                draft_socket.send_frame(conn, reply.SerializeToString())


@dataclass(frozen=True)
class SharedLinks:
    """What each shared draft link of this drafter is built from."""

    template: LocalDrafter  # the service's drafter; each link gets a pool of its own
    lock: threading.Lock  # the model's: one stream's work at a time
    max_slots: int
    max_model_len: int
    context_graphs: bool

    def link(self, conn: socket.socket, stopping: threading.Event) -> SharedRoundLink:
        return SharedRoundLink(conn, self.template, self.lock, self.max_slots,
                               self.max_model_len, self.context_graphs, stopping)
