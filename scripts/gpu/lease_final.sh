#!/usr/bin/env bash
# The closing GPU lease (two calls on one warm machine):
#   call 1  carry .carry/a (GGUF half 1, HumanEval, the spec-bench JSONL) and .whl: park them
#   call 2  carry .carry/b: convert; every mode against ar on the six spec-bench sets
#           (engine_bench.py --stages exactsets); `ddtree bench` in process at concurrency
#           1 and 8; `ddtree serve` + `ddtree bench --url` for ar and tree at c1 / c8
# Usage: bash scripts/gpu/lease_final.sh 1|2   (results under $OUT)
set -uo pipefail
source scripts/gpu/lease_env.sh
T=/tmp/ddtree-cache/smollm2-135m-instruct
D=models/smollm2-135m-dflash
case "${1:?call number}" in
1)
  cp .carry/a/part00 /tmp/gguf.part00 && cp .carry/a/HumanEval.jsonl.gz /tmp/
  mkdir -p /tmp/spec_bench && cp .carry/a/*.jsonl /tmp/spec_bench/
  nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
  ;;
2)
  cat /tmp/gguf.part00 .carry/b/part01 > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "
from pathlib import Path
from ddtree.demo.pull import pull_smollm2
print(pull_smollm2(Path('/tmp/ddtree-cache'), progress=False, gguf=Path('/tmp/SmolLM2-135M-Instruct.Q4_1.gguf')))" 2>&1 | tail -1
  timeout 200 python3 scripts/gpu/engine_bench.py --stages exactsets --target $T \
    --humaneval /tmp/HumanEval.jsonl.gz 2>&1 | tee "$OUT/engine.txt" | grep -v " c[18]: =6/6" 
  timeout 100 python3 -m ddtree.cli bench --target $T --drafter $D --prompts humaneval \
    --num-prompts 8 --modes ar,tree --budgets 32 --concurrency 1,8 --max-tokens 256 \
    --no-progress 2>&1 | tee "$OUT/bench_inprocess.txt" | tail -8
  python3 -m ddtree.cli serve --target $T --drafter $D --port 8000 --device cuda \
    --dtype bfloat16 >"$OUT/serve.log" 2>&1 &
  S=$!
  for i in $(seq 1 240); do
    kill -0 $S 2>/dev/null || { tail -20 "$OUT/serve.log"; exit 3; }
    curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 0.5
  done
  timeout 150 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts 8 --modes ar,tree --budgets 32 --concurrency 1,8 --repeats 2 \
    --max-tokens 256 --no-progress 2>&1 | tee "$OUT/bench_url.txt" | tail -8
  kill $S; wait $S
  ;;
esac
