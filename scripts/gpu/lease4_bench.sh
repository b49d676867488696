#!/usr/bin/env bash
# Lease step 4: acceptance table (all prompt sets, T=0 and T=1, linear + tree budgets) in
# parallel processes, then a single-process speed run of the four modes side by side.
set -uo pipefail
source scripts/gpu/lease_env.sh
T=/tmp/ddtree-work/cache/smollm2-135m-instruct
D=${DRAFTER:-/tmp/drafter}
P=.carry/prompts
timeout "${TABLE_SECONDS:-380}" python3 scripts/gpu/acceptance_table.py --target $T --drafter $D \
  --prompts $P/HumanEval.jsonl.gz $P/humaneval.jsonl $P/mt_bench.jsonl $P/gsm8k.jsonl \
  $P/alpaca.jsonl $P/qa.jsonl $P/sum.jsonl --num-prompts "${NUM_PROMPTS:-15}" --max-tokens 128 \
  --out "$OUT/acceptance.md" --json-out "$OUT/acceptance.json"
timeout "${SPEED_SECONDS:-170}" python3 -m ddtree.cli bench --target $T --drafter $D \
  --prompts $P/HumanEval.jsonl.gz --num-prompts 6 --modes ar,linear,tree,shadow \
  --budgets 16,64 --max-tokens 128 --json-out "$OUT/speed.json" | tee "$OUT/speed.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
