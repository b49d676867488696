#!/usr/bin/env bash
# Lease step 3: train the drafter; keep a copy in /tmp/drafter for the benchmark step.
set -euo pipefail
source scripts/gpu/lease_env.sh
bash scripts/gpu/train_demo.sh --stage train --gguf-part /tmp/gguf.part00 \
  --gguf-part .carry/b/part01 --out "$OUT" --train-seconds "${TRAIN_SECONDS:-420}" --quiet
rm -rf /tmp/drafter && cp -r "$OUT/smollm2-135m-dflash" /tmp/drafter
ls -la "$OUT" "$OUT/smollm2-135m-dflash"
