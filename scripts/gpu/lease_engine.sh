#!/usr/bin/env bash
# The engine's GPU lease in three calls on one warm machine (each well under 10 minutes):
#   call 1  carry .carry/a (GGUF half 1 + HumanEval) and .whl: park them in /tmp, install the
#           wheels, check every kernel (scripts/gpu/check_kernels.py)
#   call 2  carry .carry/b (GGUF half 2): join, check the sha256, convert the demo target,
#           then STAGES (default exact,speed) of scripts/gpu/engine_bench.py
#   call 3  (nothing to carry) STAGES=load,shapes8b,fp32 or gateway
# Usage: bash scripts/gpu/lease_engine.sh 1|2|3   (results under $OUT)
set -uo pipefail
STEP=${1:?call number}
source scripts/gpu/lease_env.sh
T=/tmp/ddtree-cache/smollm2-135m-instruct
case "$STEP" in
1)
  cp .carry/a/part00 /tmp/gguf.part00 && cp .carry/a/HumanEval.jsonl.gz /tmp/
  cp .carry/a/*.jsonl /tmp/ 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
  python3 -c "import sys,torch,triton,transformers,grpc; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__, grpc.__version__)"
  timeout 420 python3 scripts/gpu/check_kernels.py 2>&1 | tee "$OUT/check_kernels.txt"
  ;;
2)
  cat /tmp/gguf.part00 .carry/b/part01 > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "
from pathlib import Path
from ddtree.demo.pull import pull_smollm2
print(pull_smollm2(Path('/tmp/ddtree-cache'), progress=False, gguf=Path('/tmp/SmolLM2-135M-Instruct.Q4_1.gguf')))"
  timeout 500 python3 scripts/gpu/engine_bench.py --stages "${STAGES:-exact,speed}" \
    --target $T --humaneval /tmp/HumanEval.jsonl.gz 2>&1 | tee "$OUT/engine.txt"
  ;;
3)
  timeout 560 python3 scripts/gpu/engine_bench.py --stages "${STAGES:-load,shapes8b}" \
    --target $T --humaneval /tmp/HumanEval.jsonl.gz 2>&1 | tee "$OUT/engine3.txt"
  ;;
esac
