"""GenerateMany on the verifier's Unix socket: the gateway's generations on this host.

The gateway's shared stream carries one message a round for all its generations; over gRPC
each costs ~100-150 us of CPU on either side of the hop (lease 43: at ar c8 ~1,200
messages a second, the verifier's writer beside the engine thread's GIL, the gateway's
reads beside its event loop). Over this socket the same GenerateManyRequest /
GenerateManyResponse messages travel framed as the drafter link's (ddtree/draft_socket.py,
hello MANY_PREFIX + ModelInfo.instance_id [+ token]), and the same `ManyStream` answers
them: a thread reads the connection's requests, the connection's own thread writes what
the engine flushed. A connection that closes, breaks its framing or stalls a send past
SEND_TIMEOUT_S ends its stream; its generations are cancelled, as a broken gRPC stream's.
gRPC's GenerateMany stays the API (and the gateway's way on another host).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import structlog

from ddtree import draft_socket
from ddtree.v1 import verifier_pb2
from verifier_svc.generate_many import ManyStream
from verifier_svc.servicer import VerifierServicer

log = structlog.get_logger("verifier_svc.local_socket")

SEND_TIMEOUT_S = 30.0  # a message the gateway does not read this long ends its stream



class LocalManyServer(draft_socket.FrameServer):
    def __init__(self, path: str, servicer: VerifierServicer, instance_id: str, token: str,
                 max_streams: int) -> None:
        super().__init__(path, instance_id, token, max_streams, (draft_socket.MANY_PREFIX,),
                         "many_socket")
        self.servicer = servicer
        self._streams: set[ManyStream] = set()  # guarded by self._lock

    def drain(self, grace_s: float | None) -> None:
        """A graceful stop's first half: no new connections; the generations running on
        the open streams get up to `grace_s` to finish (as gRPC's grace lets a GenerateMany
        call's run), then `stop` ends the streams and cancels what is left."""
        self.stop_accepting()
        deadline = time.monotonic() + (grace_s or 0.0)
        while time.monotonic() < deadline:
            with self._lock:
                if not any(stream.has_live() for stream in self._streams):
                    return
            time.sleep(0.05)

    def serve(self, conn: socket.socket, peer: str, prefix: bytes) -> None:
        log.info("generate_many_open", peer=peer)
        stream = self.servicer.many_stream(peer)
        with self._lock:
            self._streams.add(stream)
        closed = threading.Event()  # the gateway is gone (or the server stops)
        sender = conn.dup()  # its own timeout; the reader's changes per read
        sender.settimeout(SEND_TIMEOUT_S)
        try:
            for message in stream.run(self._requests(conn, peer, closed),
                                      lambda: not closed.is_set()):
                draft_socket.send_frame(sender, message.SerializeToString())
        finally:
            closed.set()
            stream.cancel_all()  # what is still running frees its rows
            with self._lock:
                self._streams.discard(stream)
            sender.close()
            log.info("generate_many_closed", peer=peer)

    def _requests(self, conn: socket.socket, peer: str, closed: threading.Event
                  ) -> Iterator[verifier_pb2.GenerateManyRequest]:
        """The connection's requests until it closes, breaks its framing or the server
        stops; then the stream is done: its generations are cancelled (the gateway never
        half-closes this stream: it closes the connection)."""
        try:
            yield from self.messages(conn, peer, verifier_pb2.GenerateManyRequest)
        finally:
            closed.set()  # before ManyStream's reader wakes the writer: `run` ends
