#!/usr/bin/env bash
# A serving lease in four calls on one warm machine (each well under 10 minutes):
#   call 1  carry .carry/a (GGUF half 1, HumanEval, the spec-bench JSONL) and .whl: park them
#   call 2  carry .carry/b (GGUF half 2): join, convert; every mode against ar and the speed
#           table (engine_bench.py --stages exact,speed); then ar and tree@32 at concurrency 1
#           and 8 under continuous load (8 / 64 requests per run: a finished request's row
#           is refilled at once), in process and through `ddtree serve` (`ddtree bench --url`)
#   call 3  the 10-minute soak (64 streams, the drafter SIGKILLed every 60 s) started in its
#           own process session, then the drafter job (scripts/gpu/lease_drafter.sh) beside it
#   call 4  waits for the soak's report, then the drafter's acceptance table
# Usage: bash scripts/gpu/lease_serving.sh 1|2|3|4   (results under $OUT)
set -uo pipefail
source scripts/gpu/lease_env.sh
T=/tmp/ddtree-cache/smollm2-135m-instruct
H=/tmp/HumanEval.jsonl.gz
D=models/smollm2-135m-dflash

wait_healthy() {  # pid log
  for _ in $(seq 1 240); do
    kill -0 "$1" 2>/dev/null || { tail -20 "$2"; return 3; }
    curl -sf http://127.0.0.1:8000/health >/dev/null && return 0
    sleep 0.5
  done
  echo "ddtree serve not healthy in 120 s"; return 3
}

load_bench() {  # extra bench arguments...
  # c1: 8 requests; c8: 64 requests (each of the 64 prompts once), 256 tokens, 2 repeats.
  for c in 1 8; do
    n=$((c == 1 ? 8 : 64))
    timeout 200 python3 -m ddtree.cli bench "$@" --prompts humaneval --num-prompts 64 \
      --num-requests $n --modes ar,tree --budgets 32 --concurrency $c --repeats 2 \
      --max-tokens 256 --no-progress
  done
}

case "${1:?call number}" in
1)
  cp .carry/a/part00 /tmp/gguf.part00 && cp .carry/a/HumanEval.jsonl.gz /tmp/
  mkdir -p /tmp/spec_bench && cp .carry/a/*.jsonl /tmp/spec_bench/
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
  ;;
2)
  cat /tmp/gguf.part00 .carry/b/part01 > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "
from pathlib import Path
from ddtree.demo.pull import pull_smollm2
print(pull_smollm2(Path('/tmp/ddtree-cache'), progress=False, gguf=Path('/tmp/SmolLM2-135M-Instruct.Q4_1.gguf')))" 2>&1 | tail -1
  timeout 260 python3 scripts/gpu/engine_bench.py --stages exact,speed,profile --target $T \
    --humaneval $H 2>&1 | tee "$OUT/engine.txt" | grep -v " c[18]: =6/6"
  load_bench --target $T --drafter $D 2>&1 | tee "$OUT/bench_inprocess.txt" | grep -E "^(ar|tree)|c1|c8" | tail -8
  python3 -m ddtree.cli serve --target $T --drafter $D --port 8000 --device cuda \
    --dtype bfloat16 >"$OUT/serve.log" 2>&1 &
  S=$!
  wait_healthy $S "$OUT/serve.log" || exit 3
  load_bench --url http://127.0.0.1:8000 2>&1 | tee "$OUT/bench_url.txt" | grep -E "^(ar|tree)|c1|c8" | tail -8
  curl -s http://127.0.0.1:8000/metrics | grep -E "^ddtree_(batch|num_|kv)" > "$OUT/metrics.txt"
  kill $S; wait $S 2>/dev/null
  ;;
3)
  mkdir -p /tmp/soak
  setsid python3 scripts/soak.py --start --target $T --drafter $D --device cuda \
    --dtype bfloat16 --concurrency 64 --duration-s 600 --kill-drafter-every-s 60 \
    --max-tokens 128 --json-out /tmp/soak/report.json >/tmp/soak/log.txt 2>&1 < /dev/null &
  sleep 5
  SECONDS_LEFT=540 timeout 560 bash scripts/gpu/lease_drafter.sh train 2>&1 | tail -40
  tail -3 /tmp/soak/log.txt
  ;;
4)
  for _ in $(seq 1 200); do [ -s /tmp/soak/report.json ] && break; sleep 1; done
  cp /tmp/soak/report.json "$OUT/soak_report.json"; tail -c 20000 /tmp/soak/log.txt > "$OUT/soak_log.txt"
  cat "$OUT/soak_report.json"
  timeout 300 bash scripts/gpu/lease_drafter.sh table 2>&1 | tail -30
  ;;
esac
