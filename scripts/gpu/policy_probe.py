"""The load-following policy under a closed loop, in process (a finished request is
replaced at once, as `ddtree bench`'s workers do), on one engine: per concurrency 1.5 s of
ar and of auto to warm up, then ar, auto, ar, auto for `--seconds` each (alternated: the
host's drift falls on both); total tok/s, the auto rows' acceptance, engine steps a second,
and what the policy believes at the end (its snapshot, in $OUT/policy_probe.json).

    python3 scripts/gpu/policy_probe.py TARGET DRAFTER HumanEval.jsonl.gz [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import engine_bench as eb  # noqa: E402

from ddtree.engine import EngineConfig, GenerationRequest  # noqa: E402
from ddtree.engine.generate import build_engine  # noqa: E402
from ddtree.sampling import SamplingParams  # noqa: E402


class ClosedLoop:
    """Keeps `concurrency` requests of one mode in the engine for a while."""

    def __init__(self, engine: Any, prompts: list[list[int]], max_tokens: int) -> None:
        self.engine, self.prompts, self.max_tokens, self.sent = engine, prompts, max_tokens, 0

    def _send(self, mode: str) -> None:
        prompt = self.prompts[self.sent % len(self.prompts)]
        self.engine.add_request(f"r{self.sent}", GenerationRequest(
            prompt, self.max_tokens, SamplingParams(), eb.SPECS[mode], ignore_eos=True))
        self.sent += 1

    def run(self, mode: str, concurrency: int, seconds: float) -> dict[str, float]:
        for _ in range(concurrency):
            self._send(mode)
        start, tokens, steps, taus = time.perf_counter(), 0, 0, []
        while time.perf_counter() - start < seconds:
            for _, result in self.engine.step():
                tokens += len(result.new_tokens)
                if result.finished:
                    self._send(mode)
                    if result.stats is not None:
                        taus.append(result.stats.mean_acceptance_length)
            steps += 1
        wall = time.perf_counter() - start
        while self.engine.has_work:  # the rows still running finish outside the clock
            self.engine.step()
        return {"tok_s": round(tokens / wall, 1), "tau": round(sum(taus) / max(len(taus), 1), 3),
                "steps_s": round(steps / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("drafter", type=Path)
    parser.add_argument("humaneval", type=Path)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="8,32,64")
    args = parser.parse_args()
    target, drafter, tokenizer = eb.load(args, torch.bfloat16)
    prompts = eb.humaneval_prompts(args.humaneval, tokenizer, 164)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=64, max_model_len=1024))
    loop = ClosedLoop(engine, prompts, 256)
    out: dict[str, Any] = {}
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        loop.run("ar", concurrency, 1.5)
        loop.run("auto", concurrency, 1.5)
        for rep in range(2):
            for mode in ("ar", "auto"):
                row = loop.run(mode, concurrency, args.seconds)
                out[f"c{concurrency}/{mode}/{rep}"] = row
                print(f"c{concurrency} {mode:>4} rep{rep}: {row['tok_s']:9.1f} tok/s  "
                      f"tau {row['tau']:.2f}  {row['steps_s']:.0f} steps/s", flush=True)
    assert engine.policy is not None
    snapshot = engine.policy.snapshot()
    out["policy"] = snapshot
    Path(os.environ.get("OUT", "."), "policy_probe.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(snapshot["tau"]))
    for batch, belief in snapshot["batches"].items():  # type: ignore[union-attr]
        costs = {choice: (c["measured_ms"], c["traffic_ms"], c["traffic_rounds"],
                          c["tokens_per_s"]) for choice, c in belief["choices"].items()}
        print(batch, "prefers ar" if belief["prefers_ar"] else "drafts", costs)


if __name__ == "__main__":
    main()
