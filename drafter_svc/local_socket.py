"""The drafter's Draft stream on a Unix socket (framing and hello: ddtree/draft_socket.py).

Each connection is one Draft stream, answered by the same servicer code as the gRPC
stream (`DrafterServicer.serve_stream`) on a thread of its own, which reads a request,
drafts and writes the reply itself: no hand-off between threads. At most `max_streams`
connections at once (a connection past the bound is closed after its hello), as the gRPC
server bounds its streams.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import structlog
from google.protobuf.message import DecodeError

from ddtree import draft_socket
from ddtree.draft_socket import FrameError
from ddtree.engine.drafting import LocalDrafter
from ddtree.v1 import drafter_pb2
from drafter_svc.servicer import DrafterServicer
from drafter_svc.shared_round import SharedRoundLink, serve_shared

log = structlog.get_logger("drafter_svc.local_socket")

HELLO_TIMEOUT_S = 5.0  # a connection that says nothing this long after connecting is closed
SEND_TIMEOUT_S = 30.0  # a reply the verifier does not read this long ends its connection


def default_path(port: int) -> str:
    """The socket of the drafter serving gRPC on `port` (one per port on a host)."""
    return os.path.join(tempfile.gettempdir(), f"ddtree-drafter-{port}.sock")


class LocalDraftServer:
    def __init__(self, path: str, servicer: DrafterServicer, instance_id: str, token: str,
                 max_streams: int, shared: SharedLinks | None = None) -> None:
        """shared: what a shared draft link needs (None: such hellos are refused)."""
        draft_socket.check_path(path)
        self.path = path
        self.servicer = servicer
        self.instance_id = instance_id
        self.token = token
        self.max_streams = max_streams
        self.shared = shared
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._listener: socket.socket | None = None

    def start(self) -> None:
        """Binds (replacing a socket file no live process listens on) and accepts in a
        thread. OSError when the path is taken by a live listener or cannot be bound."""
        _remove_stale(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)  # this user's processes only
            listener.listen(self.max_streams)
            # set before the accept thread runs (a stop right after start closes it)
            listener.settimeout(draft_socket.WAIT_SLICE_S)  # a close does not wake accept()
        except OSError:
            listener.close()
            raise
        self._listener = listener
        threading.Thread(target=self._accept, name="draft-socket-accept", daemon=True).start()

    def stop(self) -> None:
        """Closes the listener and every connection (their streams end, their sessions
        are freed by the servicer), removes the socket file."""
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()  # the accept loop sees _stopping within WAIT_SLICE_S
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed (stop)
            conn.settimeout(HELLO_TIMEOUT_S)  # never blocking mode (draft_socket.recv_frame)
            threading.Thread(target=self._serve, args=(conn,), name="draft-socket-stream",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        peer = f"unix:{self.path}#{conn.fileno()}"
        try:
            kind = self._admit(conn, peer)
            if kind is None:
                return
            draft_socket.send_frame(conn, draft_socket.HELLO_OK)
            if kind == draft_socket.SHARED_PREFIX:
                assert self.shared is not None
                serve_shared(conn, peer, self.shared.link(conn, self._stopping))
                return
            # closing: the stream's sessions are freed at once, also when a send fails
            with contextlib.closing(self.servicer.serve_stream(self._requests(conn, peer),
                                                               peer)) as replies:
                for reply in replies:
                    conn.settimeout(SEND_TIMEOUT_S)
                    draft_socket.send_frame(conn, reply.SerializeToString())
        except (OSError, FrameError) as exc:  # the verifier went away mid-reply
            log.info("draft_socket_closed", peer=peer, reason=str(exc))
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _admit(self, conn: socket.socket, peer: str) -> bytes | None:
        """Reads and checks the hello and takes a stream slot; -> the hello's kind
        (draft_socket.HELLO_PREFIX or SHARED_PREFIX), None: refused (logged)."""
        try:
            frame = draft_socket.recv_frame(conn, time.monotonic() + HELLO_TIMEOUT_S)
        except (OSError, FrameError):
            log.warning("draft_socket_refused", peer=peer, reason="no hello")
            return None
        kind = draft_socket.hello_accepted(frame, self.instance_id, self.token)
        if kind is None:
            log.warning("draft_socket_refused", peer=peer,
                        reason="hello names another drafter or lacks the token")
            return None
        if kind == draft_socket.SHARED_PREFIX and self.shared is None:
            log.warning("draft_socket_refused", peer=peer, reason="shared draft is off")
            return None
        with self._lock:
            if len(self._connections) >= self.max_streams:
                log.warning("draft_socket_refused", peer=peer,
                            reason=f"the drafter serves at most {self.max_streams} streams")
                return None
            self._connections.add(conn)
        return kind

    def _requests(self, conn: socket.socket, peer: str) -> Iterator[drafter_pb2.DraftRequest]:
        """The connection's requests until it closes, breaks its framing or the server
        stops (the stream then ends as a gRPC stream's end does)."""
        while True:
            try:
                frame = draft_socket.recv_frame(conn, None, self._stopping)
            except (OSError, FrameError):
                return
            try:
                yield drafter_pb2.DraftRequest.FromString(frame)
            except DecodeError:
                log.warning("draft_socket_malformed", peer=peer, num_bytes=len(frame))
                return


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


def _remove_stale(path: str) -> None:
    """Removes a socket file nobody listens on (a drafter that died); raises OSError when
    a live process listens there or the path is not a socket."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # refused: nobody listens
        return
    finally:
        probe.close()
    raise OSError(f"another process listens on {path}")
