"""The drafter's RPC threads cannot be exhausted by idle Draft streams: streams are bounded
(all verifiers together and per connection) below the thread pool, a stream past the bound
is refused at once with RESOURCE_EXHAUSTED, and GetInfo / health checks (what a
reconnecting verifier calls first) always find a thread."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ddtree.healthcheck import is_serving
from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.server import build_server

QUICK_S = 5.0  # what "at once" means here: far below any thread-starvation hang


class IdleStream:
    """A Draft stream that made one round trip (so the drafter admitted it), then idles."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.requests: queue.Queue[drafter_pb2.DraftRequest | None] = queue.Queue()
        self.call = drafter_pb2_grpc.DrafterStub(channel).Draft(iter(self.requests.get, None))

    def round_trip(self) -> drafter_pb2.DraftResponse:
        self.requests.put(drafter_pb2.DraftRequest(round_id=1))  # release-only: a reply
        return next(self.call)

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()


@pytest.fixture(scope="module")
def drafter(tiny_pair: Path) -> Iterator[tuple[int, DrafterServiceConfig]]:
    config = DrafterServiceConfig(
        drafter=str(tiny_pair / "drafter"), target=str(tiny_pair / "target"),
        host="127.0.0.1", port=0, device="cpu", dtype="float32")
    server, port = build_server(config)
    yield port, config
    server.stop(None)


def channel_to(port: int) -> grpc.Channel:
    """A channel with a connection of its own (as another verifier process would have);
    channels of one process otherwise share one connection per target."""
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=options)


def refusal_of(stream: IdleStream) -> grpc.RpcError:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        stream.round_trip()
    assert time.monotonic() - started < QUICK_S
    return info.value


def test_idle_streams_never_starve_getinfo_and_extra_streams_are_refused(
    drafter: tuple[int, DrafterServiceConfig],
) -> None:
    port, config = drafter
    per_peer = config.max_streams_per_peer
    # As many idle streams as the drafter admits, from as few connections as allowed.
    num_channels = -(-config.max_streams // per_peer)
    channels = [channel_to(port) for _ in range(num_channels + 1)]
    streams: list[IdleStream] = []
    try:
        for i in range(config.max_streams):
            stream = IdleStream(channels[i // per_peer])
            assert stream.round_trip().round_id == 1
            streams.append(stream)
        # A verifier reconnecting now: GetInfo and the health check answer at once ...
        fresh = channels[-1]
        info = drafter_pb2_grpc.DrafterStub(fresh).GetInfo(
            drafter_pb2.DrafterInfoRequest(), timeout=QUICK_S)
        assert info.block_size > 0
        assert is_serving(f"127.0.0.1:{port}", timeout_s=QUICK_S)
        # ... and one stream too many is refused, not parked on a thread.
        extra = IdleStream(fresh)
        error = refusal_of(extra)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most" in (error.details() or "")
        # Freed slots are reusable: the verifier gets its stream once one idle one ends.
        streams.pop().close()
        deadline = time.monotonic() + QUICK_S * 4
        while True:
            retry = IdleStream(fresh)
            try:
                assert retry.round_trip().round_id == 1
                streams.append(retry)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() < deadline, "a closed stream's slot was never freed"
                time.sleep(0.1)  # the drafter notices the cancelled stream asynchronously
    finally:
        for stream in streams:
            stream.close()
        for channel in channels:
            channel.close()


def test_one_connection_holds_a_bounded_number_of_streams(
    drafter: tuple[int, DrafterServiceConfig],
) -> None:
    port, config = drafter
    with channel_to(port) as channel:
        streams = [IdleStream(channel) for _ in range(config.max_streams_per_peer)]
        try:
            for stream in streams:
                stream.round_trip()
            extra = IdleStream(channel)
            error = refusal_of(extra)
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "per connection" in (error.details() or "")
        finally:
            for stream in streams:
                stream.close()
