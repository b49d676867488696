#!/usr/bin/env bash
# Lease step 2: join the GGUF, convert, build prompts, generate the target's responses.
set -euo pipefail
source scripts/gpu/lease_env.sh
bash scripts/gpu/train_demo.sh --stage convert,generate --gguf-part /tmp/gguf.part00 \
  --gguf-part .carry/b/part01 --out "$OUT" --gen-seconds "${GEN_SECONDS:-220}" --quiet
