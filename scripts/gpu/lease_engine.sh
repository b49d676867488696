#!/usr/bin/env bash
# The engine's GPU lease in three calls on one warm machine (each well under 10 minutes):
#   call 1  carry .carry/a (GGUF half 1 + HumanEval) and .whl: park them in /tmp, install the
#           wheels, tune the linear tilings (scripts/gpu/tune_linear.py -> /tmp), re-check
#           every kernel's invariance (scripts/gpu/check_kernels.py --no-bench)
#   call 2  carry .carry/b (GGUF half 2): join, check the sha256, convert the demo target,
#           then STAGES (default exact,speed) of scripts/gpu/engine_bench.py
#   call 3  (nothing to carry) STAGES (default load,shapes8b,fp32), then `ddtree serve` and
#           `ddtree bench --url` (the modes side by side at concurrency 1 and 8, plots)
# Usage: bash scripts/gpu/lease_engine.sh 1|2|3   (results under $OUT)
set -uo pipefail
STEP=${1:?call number}
source scripts/gpu/lease_env.sh
T=/tmp/ddtree-cache/smollm2-135m-instruct
H=/tmp/HumanEval.jsonl.gz
# The tuned tilings of call 1 (a file the next calls' fresh working copy lacks).
[ -f /tmp/linear_tuned.json ] && cp /tmp/linear_tuned.json ddtree/kernels/linear_tuned.json
case "$STEP" in
1)
  cp .carry/a/part00 /tmp/gguf.part00 && cp .carry/a/HumanEval.jsonl.gz /tmp/
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
  timeout 200 python3 scripts/gpu/tune_linear.py --out /tmp/linear_tuned.json \
    --seconds-per-shape "${TUNE_SECONDS:-10}" 2>&1 | tee "$OUT/tune_linear.txt"
  cp /tmp/linear_tuned.json "$OUT/" ddtree/kernels/linear_tuned.json
  timeout 200 python3 scripts/gpu/check_kernels.py --no-bench 2>&1 | tail -25 | tee "$OUT/check.txt"
  ;;
2)
  cat /tmp/gguf.part00 .carry/b/part01 > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "
from pathlib import Path
from ddtree.demo.pull import pull_smollm2
print(pull_smollm2(Path('/tmp/ddtree-cache'), progress=False, gguf=Path('/tmp/SmolLM2-135M-Instruct.Q4_1.gguf')))" 2>&1 | tail -1
  timeout 520 python3 scripts/gpu/engine_bench.py --stages "${STAGES:-exact,speed}" \
    --target $T --humaneval $H 2>&1 | tee "$OUT/engine.txt"
  ;;
3)
  timeout 200 python3 scripts/gpu/engine_bench.py --stages "${STAGES:-load,shapes8b,fp32}" \
    --target $T --humaneval $H 2>&1 | tee "$OUT/engine3.txt"
  tar -C "$OUT" -cf "$OUT/engine_json.tar" $(cd "$OUT" && ls engine_*.json) && rm -f "$OUT"/engine_*.json
  python3 -m ddtree.cli serve --target $T --port 8000 --device cuda --dtype bfloat16 \
    >"$OUT/serve.log" 2>&1 &
  SERVE=$!
  python3 -c "
import time
from ddtree.cli.serve import http_ok
deadline = time.monotonic() + 240
while not http_ok('http://127.0.0.1:8000/health'):
    assert time.monotonic() < deadline, 'ddtree serve not healthy in 240 s'
    time.sleep(0.5)"
  timeout 300 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts "${NUM_PROMPTS:-8}" --modes ar,linear,tree,shadow --budgets 15,32,64 \
    --concurrency 1,8 --repeats 3 --max-tokens 256 --sweep --no-progress \
    --json-out "$OUT/r.json" --plot "$OUT/plots" 2>&1 | tee "$OUT/bench_url.txt"
  kill $SERVE; wait $SERVE 2>/dev/null; tail -5 "$OUT/serve.log"
  ;;
esac
