"""compose/docker-compose.yml passes a strict Compose validator (tests/integration/
compose_file.py: the specification's interpolation, then the `compose-spec` validator of
the dev extra; no Docker needed), its settings come from the environment (the drafter and
the verifier can be put on different GPUs), and it exposes only the gateway, on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.compose_file import ComposeError, load_compose

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def test_compose_file_is_valid() -> None:
    services = load_compose(COMPOSE_FILE, {})["services"]
    assert set(services) == {"mps", "drafter", "verifier", "gateway"}


def test_the_validator_rejects_what_compose_rejects(tmp_path: Path) -> None:
    cases = {
        "unknown key": "services:\n  a:\n    image: x\n    portz: ['1:1']\n",
        "bad port": "services:\n  a:\n    image: x\n    ports: ['notaport']\n",
        "bad condition": "services:\n  a:\n    image: x\n    depends_on:\n"
                         "      b: {condition: whenever}\n  b:\n    image: y\n",
        "undefined dependency": "services:\n  a:\n    image: x\n    depends_on: [b]\n",
        "missing required variable": "services:\n  a:\n    image: ${IMAGE:?set IMAGE}\n",
    }
    for name, text in cases.items():
        path = tmp_path / "compose.yml"
        path.write_text(text)
        with pytest.raises(ComposeError):
            load_compose(path, {})
        assert name


def test_compose_settings_come_from_the_environment() -> None:
    env = {
        "DDTREE_DRAFTER_GPU": "1",
        "DDTREE_VERIFIER_GPU": "2",
        "DDTREE_MODE": "linear",
        "DDTREE_GATEWAY_HOST_PORT": "9000",
        "DDTREE_MODELS_DIR": "/srv/models",
        "DDTREE_GRPC_TOKEN": "shared",
    }
    services = load_compose(COMPOSE_FILE, env)["services"]

    def gpus(name: str) -> list[str]:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        return [str(d) for device in devices for d in device["device_ids"]]

    assert gpus("drafter") == ["1"] and gpus("verifier") == ["2"]
    assert services["verifier"]["environment"]["DDTREE_MODE"] == "linear"
    assert services["verifier"]["environment"]["DDTREE_DRAFTER_ADDR"] == "drafter:50052"
    assert services["gateway"]["ports"] == ["127.0.0.1:9000:8000"]
    assert all(s["environment"]["DDTREE_GRPC_TOKEN"] == "shared"
               for name, s in services.items() if name != "mps")  # mps serves no gRPC
    assert all("healthcheck" in s for s in services.values())
    assert any(str(v).startswith("/srv/models") for v in _volumes(services["verifier"]))
    # Triton's compiled kernels in a volume both GPU services share (a restart skips the
    # drafter's minute of compiles)
    for name in ("drafter", "verifier"):
        cache = services[name]["environment"]["TRITON_CACHE_DIR"]
        assert f"triton-cache:{cache}" in services[name]["volumes"], name
    # the drafter's Unix socket lies in a volume the verifier mounts at the same place
    socket_dir = services["drafter"]["environment"]["DDTREE_LOCAL_SOCKET"].rsplit("/", 1)[0]
    for name in ("drafter", "verifier"):
        assert f"drafter-socket:{socket_dir}" in services[name]["volumes"], name
    assert services["verifier"]["environment"]["DDTREE_DRAFTER_SOCKET"] == "1"
    # the shared draft link: on by default on both sides, one IPC namespace (CUDA IPC)
    assert services["verifier"]["environment"]["DDTREE_DRAFTER_SHARED"] == "1"
    assert services["drafter"]["environment"]["DDTREE_SHARED_DRAFT"] == "1"
    # one IPC namespace for the three GPU services (CUDA IPC, MPS), the mps service's
    assert services["mps"]["ipc"] == "shareable"
    assert services["drafter"]["ipc"] == services["verifier"]["ipc"] == "service:mps"
    # MPS: off unless DDTREE_MPS says so; both clients look in the pipe volume it mounts
    assert services["mps"]["environment"]["DDTREE_MPS"] == "off"
    pipe = services["mps"]["environment"]["DDTREE_MPS_PIPE_DIR"]
    for name in ("mps", "drafter", "verifier"):
        assert f"mps-pipe:{pipe}" in services[name]["volumes"], name
    for name in ("drafter", "verifier"):
        assert services[name]["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe, name
    assert services["drafter"]["depends_on"]["mps"]["condition"] == "service_healthy"
    assert load_compose(COMPOSE_FILE, {"DDTREE_MPS": "on"})["services"]["mps"][
        "environment"]["DDTREE_MPS"] == "on"


def test_only_the_gateway_is_published_and_on_loopback_by_default() -> None:
    services = load_compose(COMPOSE_FILE, {})["services"]
    assert [name for name, s in services.items() if s.get("ports")] == ["gateway"]
    assert services["gateway"]["ports"] == ["127.0.0.1:8000:8000"]
    # Inside the compose network the services listen on every interface (their own
    # default is loopback, which the other containers could not reach).
    assert all(s["environment"]["DDTREE_HOST"] == "0.0.0.0"
               for name, s in services.items() if name != "mps")  # mps listens on no port


def _volumes(service: dict) -> list[str]:
    return [v["source"] if isinstance(v, dict) else v.split(":")[0] for v in service["volumes"]]
