#!/usr/bin/env bash
# Issue 12 on a lent H200, one device call per step (the target already staged by
# pull_smollm2, wheels in /tmp/site, the repository as the cwd):
#
#   bash scripts/gpu/lease_drafter.sh train   # <= 570 s: engine data, training, evals
#   bash scripts/gpu/lease_drafter.sh table   # <= 240 s: the acceptance table of a drafter
#
# train writes under $OUT (8 files at most, each <= 16 MiB): drafter/{config.json,
# model-0000{1,2}-of-00002.safetensors, model.safetensors.index.json}, data/tokens-0000N.npz
# (this call's token data, 2 bytes a token; carry them back as DATA_IN next session),
# train_log.jsonl, report.json; and keeps the drafter in /tmp/ddtree-drafter-new for `table`.
# table writes $OUT/acceptance.md and $OUT/engine_acceptance.json.
#
# Environment (defaults in brackets):
#   TARGET [/tmp/ddtree-cache/smollm2-135m-instruct]   TOTAL_SECONDS [540] hard deadline
#   GEN_SECONDS [150]  GEN_SEQS [512]  MAX_NEW_TOKENS [1024]  NUM_PROMPTS [24000]
#   TRAIN_SECONDS [330]  SHAPE [big | current]  INIT_FROM [models/smollm2-135m-dflash | none]
#   KL_WEIGHT [0]  LR [6e-4]  EVAL_EVERY [200 steps]  PATIENCE [5 evaluations]  DATA_IN []
#   LAYERS / MLP / TARGET_LAYERS (e.g. 4 / 1536 / 1,8,14,27): override SHAPE's fields
#   RESUME=1: continue the training state a previous call left on this (warm) machine
# Next session: carry $OUT/data/*.npz as DATA_IN=<dir> (those prompts are not redone) and
# INIT_FROM=<the returned drafter dir> to continue from this call's drafter.
#   table: DRAFTER [/tmp/ddtree-drafter-new]  SPEC_BENCH [/tmp/spec_bench]
#          HUMANEVAL [/tmp/HumanEval.jsonl.gz]  TABLE_PROMPTS [8 per set]  TABLE_TOKENS [256]
#          TABLE_SECONDS [240]
set -uo pipefail
START=$(date +%s.%N)
source scripts/gpu/lease_env.sh
T=${TARGET:-/tmp/ddtree-cache/smollm2-135m-instruct}
case "${1:-train}" in
train)
  TOTAL=${TOTAL_SECONDS:-540}
  # The driver keeps its own deadline; this outer limit only catches a hang past it.
  timeout -k 5 "$(( ${TOTAL%.*} + 20 ))" python3 scripts/gpu/lease_drafter.py \
    --target "$T" --out "$OUT" --start "$START" --total-seconds "$TOTAL" \
    --gen-seconds "${GEN_SECONDS:-150}" --gen-seqs "${GEN_SEQS:-512}" \
    --max-new-tokens "${MAX_NEW_TOKENS:-1024}" --num-prompts "${NUM_PROMPTS:-24000}" \
    --train-seconds "${TRAIN_SECONDS:-330}" --shape "${SHAPE:-big}" \
    --init-from "${INIT_FROM:-models/smollm2-135m-dflash}" --kl-weight "${KL_WEIGHT:-0}" \
    --lr "${LR:-6e-4}" --eval-every "${EVAL_EVERY:-200}" --patience "${PATIENCE:-5}" \
    ${DATA_IN:+--data-in "$DATA_IN"} ${RESUME:+--resume} ${LAYERS:+--num-layers "$LAYERS"} \
    ${MLP:+--intermediate-size "$MLP"} ${TARGET_LAYERS:+--target-layer-ids "$TARGET_LAYERS"}
  rc=$?
  echo "lease_drafter train: exit $rc after $(python3 -c "import time; print(round(time.time() - $START))") s"
  exit $rc
  ;;
table)
  # One process, one engine (graphs captured once): the first try (acceptance_table.py, 14
  # `ddtree bench` processes at once) did not finish in 105 s on the H200.
  D=${DRAFTER:-/tmp/ddtree-drafter-new}
  timeout "${TABLE_SECONDS:-240}" python3 scripts/gpu/engine_bench.py --stages acceptance \
    --target "$T" --drafter "$D" --humaneval "${HUMANEVAL:-/tmp/HumanEval.jsonl.gz}" \
    --spec-bench "${SPEC_BENCH:-/tmp/spec_bench}" --num-prompts "${TABLE_PROMPTS:-8}" \
    --max-tokens "${TABLE_TOKENS:-256}"
  ;;
*) echo "usage: lease_drafter.sh train|table"; exit 2 ;;
esac
