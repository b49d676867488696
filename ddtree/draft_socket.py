"""The Draft stream over a Unix socket: the drafter link's same-host transport.

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
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
import threading
import time

from ddtree.service import MAX_MESSAGE_BYTES

MAX_FRAME_BYTES = MAX_MESSAGE_BYTES
HELLO_PREFIX = b"ddtree-draft/1 "
# The shared draft link's hello (verifier_svc/shared_drafter.py): the drafter drafts over
# the verifier's own round state, opened from its shared memory.
SHARED_PREFIX = b"ddtree-shared/1 "
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


def hello_accepted(frame: bytes, instance_id: str, token: str) -> bytes | None:
    """The hello's prefix (HELLO_PREFIX or SHARED_PREFIX) when it names this process and
    carries the expected token (compared in constant time), else None."""
    prefix = next((p for p in (HELLO_PREFIX, SHARED_PREFIX) if frame.startswith(p)), None)
    if prefix is None:
        return None
    named, _, given = frame[len(prefix):].partition(b" ")
    if named == instance_id.encode() and hmac.compare_digest(given, token.encode()):
        return prefix
    return None


def check_path(path: str) -> None:
    """A usable socket path (length), or ValueError."""
    if len(path.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"local socket path {path!r} is longer than {MAX_PATH_BYTES} bytes")


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
