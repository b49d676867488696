"""Acceptance-length table for a target/drafter pair over several prompt sets.

Runs one `ddtree bench` process per (prompt set, temperature) in parallel: each process is
bound by kernel-launch latency on the host CPU, not by the GPU, so parallel processes
share one GPU without slowing each other much. Acceptance length does not depend on
timing; tokens/s from this run are NOT comparable (use `ddtree bench` alone for speed).

    python scripts/gpu/acceptance_table.py --target T --drafter D --prompts DIR/*.jsonl \
        --out docs/acceptance.md --json-out $OUT/acceptance.json [--timeout 105]

With --timeout, runs still going at the deadline are killed and the table holds the rest
(a lent GPU call has a hard limit).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--budgets", default="8,16,32,64,128")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int, default=0, help="processes at once (0 = all)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=0,
                        help="seconds for all runs; stragglers are killed and left out (0 = none)")
    parser.add_argument("--out", help="markdown table file")
    parser.add_argument("--json-out", help="all rows as JSON")
    return parser.parse_args()


def launch(args: argparse.Namespace, prompt_file: str, temperature: str,
           out_dir: Path) -> tuple[subprocess.Popen, Path]:
    out = out_dir / f"{Path(prompt_file).name.split('.')[0]}-T{temperature}.json"
    cmd = [
        sys.executable, "-m", "ddtree.cli", "bench", "--target", args.target,
        "--drafter", args.drafter, "--device", args.device, "--prompts", prompt_file,
        "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens),
        "--modes", "linear,tree", "--budgets", args.budgets, "--temperature", temperature,
        "--seed", "1234", "--warmup", str(args.warmup), "--json-out", str(out), "--no-progress",
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL), out


def finished(proc: subprocess.Popen, deadline: float | None) -> bool:
    """Waits for one run until the deadline; kills it past the deadline. True on success."""
    try:
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        return proc.wait(timeout=left) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def to_markdown(rows: list[dict], budgets: list[int]) -> str:
    sets = sorted({r["prompt_set"] for r in rows})
    temps = sorted({r["temperature"] for r in rows})
    head = "| set | T | linear | " + " | ".join(f"tree {b}" for b in budgets) + " |"
    lines = [head, "|" + "---|" * (3 + len(budgets))]
    for t in temps:
        for s in sets:
            cell = {(r["mode"], r["budget"]): r["acceptance_length"] for r in rows
                    if r["prompt_set"] == s and r["temperature"] == t}
            linear = next((v for (m, _), v in cell.items() if m == "linear"), float("nan"))
            trees = [cell.get(("tree", b), float("nan")) for b in budgets]
            lines.append(f"| {s} | {t:g} | {linear:.2f} | "
                         + " | ".join(f"{v:.2f}" for v in trees) + " |")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(p, t) for p in args.prompts for t in args.temperatures.split(",")]
        width = args.jobs or len(todo)
        jobs: list[tuple[subprocess.Popen, Path]] = []
        failed = []
        deadline = time.monotonic() + args.timeout if args.timeout else None
        for start in range(0, len(todo), width):
            wave = [launch(args, p, t, Path(tmp)) for p, t in todo[start:start + width]]
            failed += [out.name for proc, out in wave if not finished(proc, deadline)]
            jobs += wave
        rows = []
        for _, out in jobs:
            if out.exists():
                rows += [{k: v for k, v in r.items() if k not in ("samples", "runs")}
                         for r in json.loads(out.read_text())["rows"]]
    table = to_markdown(rows, budgets)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
