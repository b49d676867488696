"""Closed loop in process (a finished request is replaced at once), per concurrency: ar,
auto, ar, auto, 5 s each; tok/s, auto's rows' tau, and the policy snapshot at the end."""
import argparse, json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts/gpu")
import engine_bench as eb
from ddtree.engine import EngineConfig, GenerationRequest
from ddtree.engine.generate import build_engine
from ddtree.sampling import SamplingParams

args = argparse.Namespace(target=Path(sys.argv[1]), drafter=Path(sys.argv[2]))
target, drafter, tok = eb.load(args, eb.torch.bfloat16)
prompts = eb.humaneval_prompts(Path(sys.argv[3]), tok, 164)
engine = build_engine(target, drafter, EngineConfig(max_num_seqs=64, max_model_len=1024))
out = {}
n = 0
def loop(mode, c, seconds):
    global n
    spec = eb.SPECS[mode]
    live = set()
    def add():
        global n
        rid = f"r{n}"; n += 1
        engine.add_request(rid, GenerationRequest(prompts[n % len(prompts)], 256, SamplingParams(), spec, ignore_eos=True))
        live.add(rid)
    for _ in range(c): add()
    t0 = time.perf_counter(); toks = 0; taus = []; rounds = 0
    while time.perf_counter() - t0 < seconds:
        for rid, res in engine.step():
            toks += len(res.new_tokens)
            if res.finished:
                live.discard(rid); add()
                if res.stats is not None: taus.append(res.stats.mean_acceptance_length)
        rounds += 1
    wall = time.perf_counter() - t0
    while engine.has_work:
        engine.step()
    return toks / wall, sum(taus) / max(len(taus), 1), rounds / wall
for c in (8, 32, 64):
    loop("ar", c, 1.5); loop("auto", c, 1.5)  # warm-up at this concurrency
    for rep in range(2):
        for mode in ("ar", "auto"):
            rate, tau, rps = loop(mode, c, 5.0)
            print(f"c{c} {mode:>4} rep{rep}: {rate:9.1f} tok/s  tau {tau:.2f}  {rps:.0f} steps/s", flush=True)
            out[f"c{c}/{mode}/{rep}"] = [rate, tau, rps]
snap = engine.policy.snapshot()
out["policy"] = snap
Path(os.environ["OUT"], "policy_probe.json").write_text(json.dumps(out, indent=1))
print(json.dumps(snap["tau"]))
for b, v in snap["batches"].items():
    print(b, v["prefers_ar"], {k: (c["measured_ms"], c["traffic_ms"], c["traffic_rounds"], c["tokens_per_s"]) for k, c in v["choices"].items()})
