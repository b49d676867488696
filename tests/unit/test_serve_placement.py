"""`ddtree serve --drafter-gpu I --verifier-gpu J` places the two services on their own GPUs
(and the engine flags reach the verifier)."""

from __future__ import annotations

import pytest

from ddtree.cli import build_parser
from ddtree.cli.serve import service_commands
from ddtree.errors import DDTreeError


def device_of(argv: list[str]) -> str:
    return argv[argv.index("--device") + 1]


def test_drafter_and_verifier_go_to_the_gpus_asked_for() -> None:
    args = build_parser().parse_args([
        "serve", "--target", "t", "--drafter", "d", "--drafter-gpu", "1", "--verifier-gpu", "0",
        "--max-num-seqs", "32", "--max-budget", "64", "--no-batch-invariant"])
    commands = dict(service_commands(args, "t", "d"))
    assert device_of(commands["drafter"]) == "cuda:1"
    assert device_of(commands["verifier"]) == "cuda:0"
    verifier = commands["verifier"]
    assert verifier[verifier.index("--max-num-seqs") + 1] == "32"
    assert "--no-batch-invariant" in verifier
    drafter = commands["drafter"]  # one draft session per verifier row
    assert drafter[drafter.index("--max-sessions") + 1] == "32"
    # Requests and the drafter's warm-up share one bound on the tree size.
    assert drafter[drafter.index("--max-budget") + 1] == "64"
    assert verifier[verifier.index("--max-budget") + 1] == "64"


def test_a_budget_over_max_budget_is_refused_before_any_child_starts() -> None:
    args = build_parser().parse_args(["serve", "--target", "t", "--drafter", "d",
                                      "--budget", "32", "--max-budget", "16"])
    with pytest.raises(DDTreeError, match="--budget must be in"):
        args.func(args)


def test_without_budget_the_default_budget_fits_max_budget() -> None:
    def budget_of(*extra: str) -> str:
        args = build_parser().parse_args(["serve", "--target", "t", "--drafter", "d", *extra])
        verifier = dict(service_commands(args, "t", "d"))["verifier"]
        return verifier[verifier.index("--budget") + 1]

    assert budget_of() == "32"
    assert budget_of("--max-budget", "16") == "16"
    assert budget_of("--budget", "8", "--max-budget", "16") == "8"


def test_without_placement_both_follow_device() -> None:
    args = build_parser().parse_args(["serve", "--target", "t", "--drafter", "d",
                                      "--device", "cpu"])
    commands = dict(service_commands(args, "t", "d"))
    assert device_of(commands["drafter"]) == device_of(commands["verifier"]) == "cpu"
    assert "--batch-invariant" in commands["verifier"]


def test_tensor_parallel_flags_reach_the_verifier() -> None:
    args = build_parser().parse_args(["serve", "--target", "t", "--drafter", "d",
                                      "--tensor-parallel-size", "2", "--verifier-gpus", "2,3"])
    verifier = dict(service_commands(args, "t", "d"))["verifier"]
    assert verifier[verifier.index("--tensor-parallel-size") + 1] == "2"
    assert verifier[verifier.index("--verifier-gpus") + 1] == "2,3"


def test_a_colocated_drafter_runs_in_the_verifier() -> None:
    args = build_parser().parse_args(["serve", "--target", "t", "--drafter", "d",
                                      "--colocate-drafter"])
    commands = dict(service_commands(args, "t", "d"))
    assert list(commands) == ["verifier", "gateway"]  # no drafter service
    verifier = commands["verifier"]
    assert verifier[verifier.index("--local-drafter") + 1] == "d"
    assert "--drafter-addr" not in verifier
