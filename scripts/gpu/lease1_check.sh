#!/usr/bin/env bash
# Lease step 1: park the first GGUF half in /tmp, check the host, smoke-test the engine and
# the trainer on CUDA with the tiny pair (every mode must give the ar tokens).
set -uo pipefail
cp .carry/a/part00 /tmp/gguf.part00
source scripts/gpu/lease_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys,torch,transformers,triton,grpc,google.protobuf as p; print(sys.version.split()[0], torch.__version__, transformers.__version__, triton.__version__, grpc.__version__, p.__version__)"
python3 -m ddtree.cli models make-tiny /tmp/tiny >/dev/null 2>&1
for m in ar linear tree shadow; do
  python3 -m ddtree.cli generate --target /tmp/tiny/target --drafter /tmp/tiny/drafter \
    --device cuda --dtype float32 --mode $m --budget 16 --chat "hello there" --max-tokens 24 --json \
    | python3 -c "import json,sys; d=json.load(sys.stdin); print('$m', d['token_ids'][:12], d['stats']['mean_acceptance_length'])"
done
timeout 150 python3 -m ddtree.cli train-drafter --target /tmp/tiny/target --out /tmp/tinyd \
  --work-dir /tmp/tinywork --device cuda --num-prompts 64 --max-new-tokens 16 --gen-batch-size 32 \
  --generate-seconds 20 --num-layers 1 --intermediate-size 64 --block-size 8 --max-steps 10 \
  --train-seconds 30 --quiet 2>&1 | tail -5
ls -la /tmp/tinyd /tmp/gguf.part00
