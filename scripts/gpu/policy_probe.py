"""The load-following policy under a closed loop, in process (a finished request is
replaced at once, as `ddtree bench`'s workers do), on one engine: per concurrency 1.5 s of
ar and of auto to warm up, then ar, auto, ar, auto for `--seconds` each (alternated: the
host's drift falls on both); total tok/s, the auto rows' acceptance, engine steps a second,
and what the policy believes at the end (its snapshot, in $OUT/policy_probe.json).
`--stop-at-eos --max-num-seqs 8 --warm-up` sends what `ddtree bench --concurrency 8` does
(answers of their own length, an engine of 8 rows, warmed up); `--watch` records when the
policy's choice at the run's batch bucket flips between ar and drafting, with its beliefs
at that moment (lease 57: `auto` at c8 served ar, then drafted at 0.915x ar).

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

    def __init__(self, engine: Any, prompts: list[list[int]], max_tokens: int,
                 ignore_eos: bool = True, watch: bool = False) -> None:
        self.engine, self.prompts, self.max_tokens, self.sent = engine, prompts, max_tokens, 0
        self.ignore_eos, self.watch = ignore_eos, watch
        self.flips: list[dict[str, Any]] = []  # with `watch`: the policy's turns

    def _send(self, mode: str) -> None:
        prompt = self.prompts[self.sent % len(self.prompts)]
        self.engine.add_request(f"r{self.sent}", GenerationRequest(
            prompt, self.max_tokens, SamplingParams(), eb.SPECS[mode],
            ignore_eos=self.ignore_eos))
        self.sent += 1

    def run(self, mode: str, concurrency: int, seconds: float) -> dict[str, float]:
        for _ in range(concurrency):
            self._send(mode)
        start, tokens, steps, taus = time.perf_counter(), 0, 0, []
        policy, bucket = self.engine.policy, self.engine.plan.batch_bucket(concurrency)
        prefers = None
        while time.perf_counter() - start < seconds:
            for _, result in self.engine.step():
                tokens += len(result.new_tokens)
                if result.finished:
                    self._send(mode)
                    if result.stats is not None:
                        taus.append(result.stats.mean_acceptance_length)
            steps += 1
            if self.watch and mode == "auto" and policy is not None and steps % 8 == 0:
                now = policy.prefers_ar(bucket)
                if now != prefers:  # a turn: what the policy believed then
                    prefers = now
                    belief = policy.snapshot()
                    self.flips.append({"s": round(time.perf_counter() - start, 3),
                                       "sent": self.sent, "prefers_ar": now,
                                       "batch": belief["batches"].get(str(bucket)),
                                       "tau": belief["tau"]})
                    print(f"  c{concurrency} auto at {self.flips[-1]['s']} s, request "
                          f"{self.sent}: {'ar' if now else 'drafts'} "
                          f"{json.dumps(self.flips[-1]['batch'])}", flush=True)
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
    parser.add_argument("--stop-at-eos", action="store_true",
                        help="answers end at EOS, as `ddtree bench` sends them (default: "
                             "all 256 tokens)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--warm-up", action="store_true",
                        help="Engine.warm_up first, as `ddtree bench` and a server do")
    parser.add_argument("--watch", action="store_true",
                        help="record each turn of the policy between ar and drafting")
    args = parser.parse_args()
    target, drafter, tokenizer = eb.load(args, torch.bfloat16)
    prompts = eb.humaneval_prompts(args.humaneval, tokenizer, 164)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=args.max_num_seqs,
                                                        max_model_len=1024))
    if args.warm_up:
        engine.warm_up()
    loop = ClosedLoop(engine, prompts, 256, ignore_eos=not args.stop_at_eos, watch=args.watch)
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
    out["flips"] = loop.flips
    Path(os.environ.get("OUT", "."), "policy_probe.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(snapshot["tau"]))
    for batch, belief in snapshot["batches"].items():  # type: ignore[union-attr]
        costs = {choice: (c["measured_ms"], c["traffic_ms"], c["traffic_rounds"],
                          c["tokens_per_s"]) for choice, c in belief["choices"].items()}
        print(batch, "prefers ar" if belief["prefers_ar"] else "drafts", costs)


if __name__ == "__main__":
    main()
