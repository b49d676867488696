"""Same-host links over a Unix socket: the Draft stream (drafter link) and GenerateMany
(the gateway's generations, verifier_svc/local_socket.py), framed alike.

The drafter service and a verifier on one host (`ddtree serve`, compose with the shared
socket volume) exchange the Draft stream's DraftRequest / DraftResponse messages over a
Unix stream socket the drafter advertises in DrafterInfo.local_socket, instead of over
the gRPC stream. Python gRPC hands every message through its own threads (a request
iterator thread, a completion-queue poller, a reader): a round trip of two small
messages costs ~0.3 ms on an idle 2-core host and ~0.9 ms on the H200 host under
serving load, against ~0.01-0.02 ms for the same bytes over a Unix socket read and
written by the threads that use them. The messages, their order and the servicer
that answers them are the gRPC stream's; only the framing differs:

- a frame is a 4-byte little-endian length, then that many bytes (a serialized message,
  or the hello);
- the client's first frame is the hello: b"ddtree-draft/1 " + DrafterInfo.instance_id,
  then b" " + the gRPC token when the drafter requires one; the drafter answers
  b"ok" or closes the socket (a socket file left by another drafter process, or a
  wrong token, never joins a stream);
- then every client frame is a DraftRequest, every server frame its DraftResponse, in
  order, as on the gRPC stream (a hello of SHARED_PREFIX instead opens the shared
  draft link, whose frames drafter_svc/shared_round.py describes). A frame longer
  than MAX_FRAME_BYTES, a malformed message or a closed socket ends the connection
  (the verifier falls back to ar for that round and reconnects, as after a broken
  gRPC stream).

GenerateMany over the verifier's socket (hello b"ddtree-many/1 " + ModelInfo.instance_id
[+ token]) is the same: after b"ok" every client frame is a GenerateManyRequest, every
server frame a GenerateManyResponse, as on the gRPC stream. `FrameServer` is both
servers' listener: it binds, admits a connection after its hello, bounds the number of
connections and hands each to the service's own code on a thread of its own.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import stat
import struct
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import structlog
from google.protobuf.message import DecodeError, Message

from ddtree.service import MAX_MESSAGE_BYTES

MAX_FRAME_BYTES = MAX_MESSAGE_BYTES
M = TypeVar("M", bound=Message)
HELLO_PREFIX = b"ddtree-draft/1 "
# The shared draft link's hello (verifier_svc/shared_drafter.py): the drafter drafts over
# the verifier's own round state, opened from its shared memory.
SHARED_PREFIX = b"ddtree-shared/1 "
# GenerateMany on the verifier's socket (the gateway's generations).
MANY_PREFIX = b"ddtree-many/1 "
HELLO_OK = b"ok"
# The shared link's answer to a request done, and its per-round frame: b"D", the round's
# batch and tree nodes (drafter_svc/shared_round.py).
SHARED_OK = b"k"
SHARED_DRAFT = struct.Struct("<cII")
# The byte that carries a frame's file descriptors (SCM_RIGHTS), sent right after it.
FD_CARRIER = b"F"
MAX_FDS = 16
_LENGTH = struct.Struct("<I")
# sockaddr_un's sun_path holds 108 bytes on Linux (104 on macOS), the terminating NUL included.
MAX_PATH_BYTES = 103
# A read without a deadline wakes this often to see whether its connection is closing.
WAIT_SLICE_S = 0.5


class FrameError(ConnectionError):
    """The peer closed the socket or broke the framing; the connection is done."""


def hello(instance_id: str, token: str = "", prefix: bytes = HELLO_PREFIX) -> bytes:
    return prefix + instance_id.encode() + (b" " + token.encode() if token else b"")


def hello_accepted(frame: bytes, instance_id: str, token: str,
                   prefixes: Sequence[bytes] = (HELLO_PREFIX, SHARED_PREFIX)) -> bytes | None:
    """The hello's prefix (one of `prefixes`) when it names this process and carries the
    expected token (compared in constant time), else None."""
    prefix = next((p for p in prefixes if frame.startswith(p)), None)
    if prefix is None:
        return None
    named, _, given = frame[len(prefix):].partition(b" ")
    if named == instance_id.encode() and hmac.compare_digest(given, token.encode()):
        return prefix
    return None


def default_path(service: str, port: int) -> str:
    """The socket of `service` ("drafter", "verifier") serving gRPC on `port` (one per port
    on a host), in the temporary directory."""
    return os.path.join(tempfile.gettempdir(), f"ddtree-{service}-{port}.sock")


def check_path(path: str) -> None:
    """A usable socket path (length), or ValueError."""
    if len(path.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"local socket path {path!r} is longer than {MAX_PATH_BYTES} bytes")


def connect(path: str, hello_frame: bytes, timeout_s: float) -> socket.socket:
    """A connection to the socket at `path` whose hello was answered ok (the socket keeps
    a timeout of `timeout_s`); OSError when the socket is missing, refuses, or answers
    the hello with anything but ok (another process, a wrong token)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(path)
        send_frame(sock, hello_frame)
        answer = recv_frame(sock, time.monotonic() + timeout_s)
    except (OSError, FrameError) as exc:
        sock.close()
        raise OSError(f"{path}: {exc}") from exc
    if answer != HELLO_OK:
        sock.close()
        raise OSError(f"{path}: hello refused")
    return sock


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def send_fds(sock: socket.socket, fds: list[int]) -> None:
    """The file descriptors of the frame just sent (none: nothing is sent)."""
    if fds:
        socket.send_fds(sock, [FD_CARRIER], fds)


def recv_fds(sock: socket.socket, count: int, deadline: float) -> list[int]:
    """The `count` file descriptors sent with the last frame (send_fds)."""
    if not count:
        return []
    if count > MAX_FDS:
        raise FrameError(f"{count} file descriptors exceed {MAX_FDS}")
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    data, fds, _, _ = socket.recv_fds(sock, 1, count)
    if data != FD_CARRIER or len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise FrameError("the frame's file descriptors did not arrive")
    return list(fds)


def recv_frame(sock: socket.socket, deadline: float | None = None,
               stop: threading.Event | None = None) -> bytes:
    """The next frame's bytes. `deadline` (time.monotonic()) bounds the whole read: past it
    TimeoutError (the stream is then out of step: close it). Without one the read waits
    for as long as it takes, in slices of WAIT_SLICE_S, and ends with FrameError once
    `stop` is set. FrameError also when the peer closed the socket or sent a frame over
    MAX_FRAME_BYTES. The socket keeps a timeout (never blocking mode): a second socket
    object over the same connection (`socket.dup`, the sender's) stays non-blocking."""
    (length,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size, deadline, stop))
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return bytes(_recv_exactly(sock, length, deadline, stop))


class FrameReader:
    """A connection's frames, as many at a time as its reads bring (one read may hold
    several small frames: one wake-up and one hand-over for all of them)."""

    CHUNK_BYTES = 1 << 16

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self._sock = sock
        self._stop = stop
        self._buffer = bytearray()

    def next_frames(self) -> list[bytes]:
        """The complete frames received, waiting for at least one; FrameError when the
        peer closed the socket, sent a frame over MAX_FRAME_BYTES, or `stop` is set."""
        while True:
            frames = self._split()
            if frames:
                return frames
            self._fill()

    def _split(self) -> list[bytes]:
        frames: list[bytes] = []
        start, buffer = 0, self._buffer
        with memoryview(buffer) as view:  # one copy a frame; released before the del
            while len(buffer) - start >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(buffer, start)
                if length > MAX_FRAME_BYTES:
                    raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
                end = start + _LENGTH.size + length
                if end > len(buffer):
                    break
                frames.append(bytes(view[start + _LENGTH.size:end]))
                start = end
        if start:
            del buffer[:start]
        return frames

    def _fill(self) -> None:
        self._sock.settimeout(WAIT_SLICE_S)
        while True:
            try:
                data = self._sock.recv(self.CHUNK_BYTES)
            except TimeoutError:
                if self._stop.is_set():
                    raise FrameError("the connection is closing") from None
                continue
            if not data:
                raise FrameError("the peer closed the socket")
            self._buffer += data
            return


def _recv_exactly(sock: socket.socket, size: int, deadline: float | None,
                  stop: threading.Event | None) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        wait = WAIT_SLICE_S if deadline is None else min(deadline - time.monotonic(),
                                                         WAIT_SLICE_S)
        if wait <= 0:
            raise TimeoutError("no complete frame before the deadline")
        sock.settimeout(wait)
        try:
            count = sock.recv_into(view[got:], size - got)
        except TimeoutError:  # socket.timeout is TimeoutError since Python 3.10
            if stop is not None and stop.is_set():
                raise FrameError("the connection is closing") from None
            continue
        if count == 0:
            raise FrameError("the peer closed the socket")
        got += count
    return buffer


HELLO_TIMEOUT_S = 5.0  # a connection that says nothing this long after connecting is closed


class FrameServer(ABC):
    """A Unix socket's listener: binds `path` (this user's only), admits a connection once
    its hello names `instance_id` with `token` and one of `prefixes`, at most
    `max_connections` at once (a connection past the bound is closed after its hello),
    and runs `serve(conn, peer, prefix)` on a thread of its own after answering ok; the
    connection is closed when `serve` returns. `stop` closes the listener and every
    connection and removes the socket file."""

    def __init__(self, path: str, instance_id: str, token: str, max_connections: int,
                 prefixes: Sequence[bytes], name: str) -> None:
        check_path(path)
        self.path = path
        self.instance_id = instance_id
        self.token = token
        self.max_connections = max_connections
        self.prefixes = tuple(prefixes)
        self.name = name  # log events and thread names: "draft_socket", "many_socket"
        self.log = structlog.get_logger(name)
        self._stopping = threading.Event()  # every connection ends
        self._accepting_stopped = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None

    @abstractmethod
    def serve(self, conn: socket.socket, peer: str, prefix: bytes) -> None:
        """One admitted connection, on its own thread, until it is done."""

    def admits(self, prefix: bytes) -> str:
        """Why a hello of `prefix` is refused, "" when it is not."""
        return ""

    @property
    def stopping(self) -> threading.Event:
        return self._stopping

    def messages(self, conn: socket.socket, peer: str, kind: type[M]) -> Iterator[M]:
        """The connection's frames parsed as `kind` until it closes, breaks its framing,
        sends a malformed message (logged) or the server stops."""
        while True:
            try:
                frame = recv_frame(conn, None, self._stopping)
            except (OSError, FrameError):
                return
            try:
                yield kind.FromString(frame)
            except DecodeError:
                self.log.warning(f"{self.name}_malformed", peer=peer, num_bytes=len(frame))
                return

    def start(self) -> None:
        """Binds (replacing a socket file no live process listens on) and accepts in a
        thread. OSError when the path is taken by a live listener or cannot be bound."""
        remove_stale(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)  # this user's processes only
            listener.listen(self.max_connections)
            # set before the accept thread runs (a stop right after start closes it)
            listener.settimeout(WAIT_SLICE_S)  # a close does not wake accept()
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, name=f"{self.name}-accept",
                                          daemon=True)
        self._acceptor.start()

    def stop_accepting(self) -> None:
        """Closes the listener and removes the socket file; open connections go on.
        Returns once the accept thread has ended: a daemon thread still waking from
        accept() while the interpreter exits aborted the test process now and then
        ("terminate called without an active exception", exit 134, with two servers'
        accept threads in one process)."""
        self._accepting_stopped.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() (Linux)
            self._listener.close()  # elsewhere the loop sees the flag within WAIT_SLICE_S
        if self._acceptor is not None and self._acceptor is not threading.current_thread():
            self._acceptor.join(timeout=2 * WAIT_SLICE_S)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def stop(self) -> None:
        """Stops accepting, then ends every open connection."""
        self.stop_accepting()
        self._stopping.set()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._accepting_stopped.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed (stop)
            conn.settimeout(HELLO_TIMEOUT_S)  # never blocking mode (recv_frame)
            threading.Thread(target=self._serve, args=(conn,), name=f"{self.name}-stream",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        peer = f"unix:{self.path}#{conn.fileno()}"
        try:
            prefix = self._admit(conn, peer)
            if prefix is None:
                return
            send_frame(conn, HELLO_OK)
            self.serve(conn, peer, prefix)
        except (OSError, FrameError) as exc:  # the peer went away mid-reply
            self.log.info(f"{self.name}_closed", peer=peer, reason=str(exc))
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _admit(self, conn: socket.socket, peer: str) -> bytes | None:
        """Reads and checks the hello and takes a connection slot; -> the hello's prefix,
        None: refused (logged)."""
        event = f"{self.name}_refused"
        try:
            frame = recv_frame(conn, time.monotonic() + HELLO_TIMEOUT_S)
        except (OSError, FrameError):
            self.log.warning(event, peer=peer, reason="no hello")
            return None
        prefix = hello_accepted(frame, self.instance_id, self.token, self.prefixes)
        if prefix is None:
            self.log.warning(event, peer=peer,
                             reason="hello names another process or lacks the token")
            return None
        reason = self.admits(prefix)
        if reason:
            self.log.warning(event, peer=peer, reason=reason)
            return None
        with self._lock:
            if len(self._connections) >= self.max_connections:
                self.log.warning(event, peer=peer, reason=f"at most {self.max_connections} "
                                 "connections at once")
                return None
            self._connections.add(conn)
        return prefix


S = TypeVar("S", bound=FrameServer)


def start_server(configured: str, service: str, port: int, make: Callable[[str, str], S],
                 failed_event: str) -> S | None:
    """A service's socket server, started: `configured` is its path, "auto" (default_path
    for `service` and its gRPC `port`) or "" (none); `make(path, instance_id)` builds it
    with a fresh random id. A socket that cannot be bound (or an `auto` path too long) is
    logged as `failed_event` and left out: clients then use gRPC."""
    if not configured:
        return None
    path = default_path(service, port) if configured == "auto" else configured
    try:
        server = make(path, secrets.token_hex(16))
        server.start()
    except (OSError, ValueError) as exc:
        structlog.get_logger(service).error(failed_event, path=path, error=str(exc))
        return None
    return server


def remove_stale(path: str) -> None:
    """Removes a socket file nobody listens on (a process that died); raises OSError when
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
