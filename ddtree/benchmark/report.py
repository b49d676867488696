"""The JSON report (`--json-out`): every row with its raw per-request samples, the run's
settings and environment, the sweep result. Its shape is `schema.json` beside this file
(documented in docs/bench.md); `SCHEMA_VERSION` changes whenever that shape does."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ddtree.benchmark.config import BenchConfig
from ddtree.benchmark.environment import environment
from ddtree.benchmark.row import BenchRow
from ddtree.errors import InvalidArgumentError

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("schema.json")


def run_config(config: BenchConfig, targets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "targets": targets,
        "settings": asdict(config.settings),
        "repeats": config.repeats,
        "warmup": config.warmup,
        "num_requests": config.num_requests,
        "duration_s": config.duration_s,
        "seed": config.seed,
    }


def build_report(rows: Sequence[BenchRow], config: BenchConfig,
                 targets: dict[str, dict[str, Any]], command: Sequence[str],
                 sweep: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(command),
        "environment": environment(),
        "config": run_config(config, targets),
        "rows": [row.to_dict() for row in rows],
        "sweep": sweep,
    }


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")


def read_report(path: str | Path) -> dict[str, Any]:
    """A report written by `ddtree bench --json-out` (any schema version we know)."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(f"cannot read report {path}: {exc}") from exc
    if not isinstance(report, dict) or report.get("schema_version") != SCHEMA_VERSION:
        raise InvalidArgumentError(
            f"{path} is not a ddtree bench report of schema version {SCHEMA_VERSION}")
    return report


def schema() -> dict[str, Any]:
    return dict(json.loads(SCHEMA_PATH.read_text()))
