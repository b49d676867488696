"""Securing the gRPC links: a shared token checked by a server interceptor (every RPC but
health checks; UNAUTHENTICATED otherwise), the verifier carrying it to the drafter, TLS
with a server certificate and mutual TLS with a client CA, and reflection switched off."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ddtree.healthcheck import is_serving
from ddtree.service import GrpcSecurity, open_channel
from ddtree.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.server import build_server as build_drafter
from tests.integration.conftest import RPC_TIMEOUT_S, gateway_config, running_gateway
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.server import build_server as build_verifier

TOKEN = "s3cret-token"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for localhost / 127.0.0.1 and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        ext = d / f"{name}.ext"
        ext.write_text(f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                "-extfile", str(ext), "-out", str(d / f"{name}.pem"))
    return {name: str(d / name) for name in ("ca.pem", "server.pem", "server.key",
                                             "client.pem", "client.key")}


def drafter_config(pair: Path, **fields: object) -> DrafterServiceConfig:
    return DrafterServiceConfig(drafter=str(pair / "drafter"), target=str(pair / "target"),
                                host="127.0.0.1", port=0, device="cpu", dtype="float32",
                                **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def secured(tiny_pair: Path) -> Iterator[tuple[int, int]]:
    """A drafter and a verifier that both require the token; -> their ports."""
    drafter, drafter_port = build_drafter(drafter_config(tiny_pair, grpc_token=TOKEN))
    config = VerifierServiceConfig(
        target=str(tiny_pair / "target"), drafter_addr=f"127.0.0.1:{drafter_port}",
        host="127.0.0.1", port=0, device="cpu", dtype="float32", mode="tree", budget=4,
        grpc_token=TOKEN)
    verifier, verifier_port = build_verifier(config)
    yield drafter_port, verifier_port
    verifier.stop(None)
    drafter.stop(None)


def test_calls_without_the_token_are_unauthenticated_but_health_checks_pass(
    secured: tuple[int, int],
) -> None:
    drafter_port, verifier_port = secured
    for token in ("", "wrong"):
        with open_channel(f"127.0.0.1:{verifier_port}", GrpcSecurity(token=token)) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            generate = verifier_pb2.GenerateRequest(prompt_ids=[5, 6], max_tokens=2)
            calls = [(stub.GetModelInfo, verifier_pb2.ModelInfoRequest()),
                     (stub.Abort, verifier_pb2.AbortRequest(request_id="x")),
                     (stub.Generate, generate)]
            for method, request in calls:
                with pytest.raises(grpc.RpcError) as info:
                    list(method(request, timeout=5)) if method is stub.Generate else method(
                        request, timeout=5)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with open_channel(f"127.0.0.1:{drafter_port}") as channel:
        # A bidi stream is refused before the client sends anything.
        call = drafter_pb2_grpc.DrafterStub(channel).Draft(iter(()), timeout=5)
        with pytest.raises(grpc.RpcError) as info:
            next(call)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert is_serving(f"127.0.0.1:{verifier_port}") and is_serving(f"127.0.0.1:{drafter_port}")


def test_with_the_token_the_verifier_drafts_through_a_token_protected_drafter(
    secured: tuple[int, int],
) -> None:
    _, verifier_port = secured
    with open_channel(f"127.0.0.1:{verifier_port}", GrpcSecurity(token=TOKEN)) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        info = stub.GetModelInfo(verifier_pb2.ModelInfoRequest(), timeout=RPC_TIMEOUT_S)
        assert info.drafter_connected
        request = verifier_pb2.GenerateRequest(
            prompt_ids=[5, 6, 7], max_tokens=12, ignore_eos=True,
            spec=common_pb2.SpecParams(mode=common_pb2.MODE_TREE, budget=4))
        responses = list(stub.Generate(request, timeout=RPC_TIMEOUT_S))
    assert sum(len(r.token_ids) for r in responses) == 12
    assert sum(sum(r.drafted_nodes) for r in responses) > 0  # drafted, not ar fallback


def test_tls_server_certificate_and_mutual_tls(tiny_pair: Path, pki: dict[str, str]) -> None:
    tls = {"tls_cert": pki["server.pem"], "tls_key": pki["server.key"]}
    server, port = build_drafter(drafter_config(tiny_pair, **tls,
                                                tls_client_ca=pki["ca.pem"]))
    address = f"127.0.0.1:{port}"
    client = GrpcSecurity(tls_ca=pki["ca.pem"], tls_cert=pki["client.pem"],
                          tls_key=pki["client.key"])
    try:
        with open_channel(address, client) as channel:
            info = drafter_pb2_grpc.DrafterStub(channel).GetInfo(
                drafter_pb2.DrafterInfoRequest(), timeout=RPC_TIMEOUT_S)
            assert info.block_size > 0
        assert is_serving(address, security=client)
        # Plaintext, or TLS without a client certificate, does not get in.
        assert not is_serving(address, timeout_s=2.0)
        assert not is_serving(address, timeout_s=2.0, security=replace(
            client, tls_cert="", tls_key=""))
    finally:
        server.stop(None)


def reflected_services(port: int) -> list[str]:
    with open_channel(f"127.0.0.1:{port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(stub.ServerReflectionInfo(iter([request]), timeout=10))
    return [s.name for s in reply.list_services_response.service]


def test_reflection_is_on_by_default_and_can_be_switched_off(tiny_pair: Path) -> None:
    on, on_port = build_drafter(drafter_config(tiny_pair))
    off, off_port = build_drafter(drafter_config(tiny_pair, is_reflection=False))
    try:
        assert "ddtree.v1.Drafter" in reflected_services(on_port)
        with pytest.raises(grpc.RpcError) as info:
            reflected_services(off_port)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        on.stop(None)
        off.stop(None)


def test_the_gateway_carries_the_token_and_speaks_tls_to_the_verifier(
    tiny_pair: Path, pki: dict[str, str]
) -> None:
    config = VerifierServiceConfig(
        target=str(tiny_pair / "target"), host="127.0.0.1", port=0, device="cpu",
        dtype="float32", mode="ar", grpc_token=TOKEN, tls_cert=pki["server.pem"],
        tls_key=pki["server.key"])
    verifier, port = build_verifier(config)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0}
    try:
        secure = gateway_config(tiny_pair, port, grpc_token=TOKEN, tls_ca=pki["ca.pem"])
        with running_gateway(secure) as url:
            assert httpx.get(f"{url}/health", timeout=30).status_code == 200
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
        tokenless = gateway_config(tiny_pair, port, tls_ca=pki["ca.pem"])
        with running_gateway(tokenless) as url:
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert reply.status_code == 500 and TOKEN not in reply.text
            assert httpx.get(f"{url}/health", timeout=30).status_code == 503
    finally:
        verifier.stop(None)
