"""The services' frozen configs: flags override DDTREE_* environment variables, which
override the defaults; invalid settings stop the process with a usage error."""

from __future__ import annotations

from pathlib import Path

import pytest

from drafter_svc.config import parse_config as drafter_config
from gateway.config import parse_config as gateway_config
from verifier_svc.config import parse_config as verifier_config


def test_drafter_config_reads_environment_then_flags() -> None:
    env = {
        "DDTREE_DRAFTER": "/m/d",
        "DDTREE_TARGET": "/m/t",
        "DDTREE_PORT": "6000",
        "DDTREE_MAX_SESSIONS": "3",
    }
    config = drafter_config(["--port", "0"], env)
    assert (config.drafter, config.target, config.port, config.max_sessions) == (
        "/m/d",
        "/m/t",
        0,
        3,
    )


def test_verifier_config_reads_environment_then_flags() -> None:
    env = {
        "DDTREE_TARGET": "/m/t",
        "DDTREE_DRAFTER_ADDR": "drafter:50052",
        "DDTREE_BUDGET": "15",
        "DDTREE_MAX_TOPK": "8",
    }
    config = verifier_config(["--mode", "linear"], env)
    assert config.default_spec.mode == "linear" and config.default_spec.budget == 15
    assert config.default_spec.max_topk == 8 and config.drafter_addr == "drafter:50052"
    assert verifier_config(["--max-topk", "0"], env).max_topk is None


def test_tensor_parallel_size_from_the_environment_runs_without_graphs() -> None:
    env = {"DDTREE_TARGET": "/m/t", "DDTREE_TENSOR_PARALLEL_SIZE": "2",
           "DDTREE_VERIFIER_GPUS": "0,1"}
    config = verifier_config(["--mode", "ar"], env)
    assert config.tensor_parallel_size == 2 and config.verifier_gpus == "0,1"
    assert not config.engine_config().cuda_graphs  # followers get their inputs eagerly
    assert verifier_config(["--mode", "ar"], {"DDTREE_TARGET": "t"}).tensor_parallel_size == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--target", "t"],  # tree mode without a drafter address
        ["--target", "t", "--mode", "ar", "--budget", "0"],
        ["--target", "t", "--mode", "ar", "--port", "70000"],
        ["--target", "t", "--mode", "ar", "--budget", "64", "--max-budget", "32"],
        ["--target", "t", "--mode", "ar", "--tensor-parallel-size", "0"],
    ],
)
def test_invalid_verifier_settings_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        verifier_config(argv, {})
    assert exited.value.code == 2


def test_missing_checkpoints_are_usage_errors() -> None:
    with pytest.raises(SystemExit):
        drafter_config([], {})


def test_services_bind_loopback_unless_told_otherwise() -> None:
    assert verifier_config(["--target", "t", "--mode", "ar"], {}).host == "127.0.0.1"
    assert drafter_config(["--drafter", "d", "--target", "t"], {}).host == "127.0.0.1"
    assert verifier_config(["--target", "t", "--mode", "ar"], {"DDTREE_HOST": "0.0.0.0"}).host \
        == "0.0.0.0"


def test_session_idle_timeout_flag_and_environment() -> None:
    base = ["--target", "t", "--mode", "ar"]
    assert verifier_config(base, {}).session_idle_timeout_s == 60.0
    env = {"DDTREE_SESSION_IDLE_TIMEOUT": "12.5"}
    assert verifier_config(base, env).session_idle_timeout_s == 12.5
    assert verifier_config([*base, "--session-idle-timeout", "3"], env).session_idle_timeout_s == 3
    with pytest.raises(SystemExit):
        verifier_config([*base, "--session-idle-timeout", "0"], {})


def test_grpc_token_tls_and_reflection_settings(tmp_path) -> None:  # noqa: ANN001
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("y")
    env = {"DDTREE_GRPC_TOKEN": "zz-secret-zz", "DDTREE_TLS_CERT": str(cert),
           "DDTREE_TLS_KEY": str(key)}
    config = verifier_config(["--target", "t", "--mode", "ar", "--no-reflection"], env)
    assert config.security.token == "zz-secret-zz" and config.security.tls_cert == str(cert)
    assert not config.is_reflection and "zz-secret-zz" not in repr(config)
    drafter = drafter_config(["--drafter", "d", "--target", "t"], env)
    assert drafter.security.token == "zz-secret-zz" and drafter.is_reflection
    with pytest.raises(SystemExit):  # a certificate without its key
        drafter_config(["--drafter", "d", "--target", "t", "--tls-cert", str(cert)], {})
    with pytest.raises(SystemExit):  # a file that is not there
        drafter_config(["--drafter", "d", "--target", "t", "--tls-cert", "/nope",
                        "--tls-key", str(key)], {})


def test_alternating_halves_are_off_unless_asked_for() -> None:
    base = ["--target", "t", "--drafter-addr", "h:1"]
    assert verifier_config(base, {}).engine_config().alternate is False
    assert verifier_config(base + ["--alternate"], {}).engine_config().alternate is True
    assert verifier_config(base, {"DDTREE_ALTERNATE": "1"}).alternate is True
    assert verifier_config(base + ["--no-alternate"], {"DDTREE_ALTERNATE": "1"}).alternate is False


def test_trees_are_asked_for_ahead_and_context_graphs_on_unless_turned_off() -> None:
    base = ["--target", "t", "--drafter-addr", "h:1"]
    assert verifier_config(base, {}).engine_config().send_ahead is True
    assert verifier_config(base + ["--no-send-ahead"], {}).engine_config().send_ahead is False
    assert verifier_config(base, {"DDTREE_SEND_AHEAD": "0"}).send_ahead is False
    drafter = ["--drafter", "d", "--target", "t"]
    assert drafter_config(drafter, {}).context_graphs is True
    assert drafter_config(drafter + ["--no-context-graphs"], {}).context_graphs is False
    assert drafter_config(drafter, {"DDTREE_CONTEXT_GRAPHS": "0"}).context_graphs is False
    assert drafter_config(drafter + ["--context-graphs"],
                          {"DDTREE_CONTEXT_GRAPHS": "0"}).context_graphs is True


def test_the_draft_stream_takes_the_drafters_socket_unless_turned_off() -> None:
    drafter = ["--drafter", "d", "--target", "t"]
    assert drafter_config(drafter, {}).local_socket == "auto"
    assert drafter_config(drafter + ["--local-socket", "none"], {}).local_socket == ""
    assert drafter_config(drafter, {"DDTREE_LOCAL_SOCKET": "/run/d.sock"}).local_socket == (
        "/run/d.sock")
    assert drafter_config(drafter + ["--local-socket", "/x.sock"],
                          {"DDTREE_LOCAL_SOCKET": "off"}).local_socket == "/x.sock"
    with pytest.raises(SystemExit):  # longer than a Unix socket address holds
        drafter_config(drafter + ["--local-socket", "/" + "s" * 120], {})
    base = ["--target", "t", "--drafter-addr", "h:1"]
    assert verifier_config(base, {}).drafter_socket is True
    assert verifier_config(base + ["--no-drafter-socket"], {}).drafter_socket is False
    assert verifier_config(base, {"DDTREE_DRAFTER_SOCKET": "0"}).drafter_socket is False


def test_the_shared_draft_link_is_on_unless_turned_off_on_either_side() -> None:
    drafter = ["--drafter", "d", "--target", "t"]
    assert drafter_config(drafter, {}).shared_draft is True
    assert drafter_config(drafter + ["--no-shared-draft"], {}).shared_draft is False
    assert drafter_config(drafter, {"DDTREE_SHARED_DRAFT": "0"}).shared_draft is False
    base = ["--target", "t", "--drafter-addr", "h:1"]
    assert verifier_config(base, {}).drafter_shared is True
    assert verifier_config(base + ["--no-drafter-shared"], {}).drafter_shared is False
    assert verifier_config(base, {"DDTREE_DRAFTER_SHARED": "0"}).drafter_shared is False
    assert verifier_config(base + ["--drafter-shared"],
                           {"DDTREE_DRAFTER_SHARED": "0"}).drafter_shared is True


def test_the_gil_switch_interval_comes_from_the_environment() -> None:
    import sys

    from ddtree.service import DEFAULT_GIL_SWITCH_INTERVAL_S, configure_threads

    before = sys.getswitchinterval()
    try:
        assert configure_threads({"DDTREE_GIL_SWITCH_INTERVAL_S": "0.002"}) == 0.002
        assert sys.getswitchinterval() == pytest.approx(0.002)
        assert configure_threads({}) == DEFAULT_GIL_SWITCH_INTERVAL_S
        with pytest.raises(ValueError, match="must be > 0"):
            configure_threads({"DDTREE_GIL_SWITCH_INTERVAL_S": "0"})
    finally:
        sys.setswitchinterval(before)


def test_gateway_merge_when_behind_is_on_unless_the_flag_or_environment_says_off(
        tmp_path: Path) -> None:
    base = ["--verifier-addr", "127.0.0.1:1", "--target", str(tmp_path)]
    assert gateway_config(base, {}).merge_when_behind
    assert not gateway_config([*base, "--no-merge-when-behind"], {}).merge_when_behind
    assert not gateway_config(base, {"DDTREE_MERGE_WHEN_BEHIND": "0"}).merge_when_behind
    on_again = [*base, "--merge-when-behind"]
    assert gateway_config(on_again, {"DDTREE_MERGE_WHEN_BEHIND": "0"}).merge_when_behind


def test_generate_many_takes_the_verifiers_socket_unless_turned_off(tmp_path: Path) -> None:
    base = ["--target", "t", "--mode", "ar"]
    assert verifier_config(base, {}).generate_socket == "auto"
    assert verifier_config(base + ["--generate-socket", "off"], {}).generate_socket == ""
    assert verifier_config(base, {"DDTREE_GENERATE_SOCKET": "/run/v.sock"}).generate_socket == (
        "/run/v.sock")
    with pytest.raises(SystemExit):  # longer than a Unix socket address holds
        verifier_config(base + ["--generate-socket", "/" + "s" * 120], {})
    gateway = ["--verifier-addr", "127.0.0.1:1", "--target", str(tmp_path)]
    assert gateway_config(gateway, {}).verifier_socket is True
    assert gateway_config([*gateway, "--no-verifier-socket"], {}).verifier_socket is False
    assert gateway_config(gateway, {"DDTREE_VERIFIER_SOCKET": "0"}).verifier_socket is False
