#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU host (NOT RUN YET: no multi-GPU machine was lent when it
# was written). For each TP size: `ddtree serve --tensor-parallel-size N` (ranks on GPUs
# 0..N-1, the drafter on $DRAFTER_GPU), then
#   1. `ddtree bench --url`: per-request tok/s at concurrency 1 and throughput at 32, ar and
#      tree (budget 32), JSON in $OUT/tp<N>_bench.json;
#   2. the tokens of $NUM_AGREE fixed prompts at T=0 straight from the verifier (gRPC, ar and
#      tree), in $OUT/tp<N>_tokens.json.
# Then how many requests of each TP size equal TP 1's tokens in bf16, and where the first
# divergence falls (all-reduce sums in another order: bf16 TP tokens need not equal TP 1's;
# in float32 on the CPU they do, tests/unit/test_tensor_parallel.py).
# Sizes must divide the target's query heads, KV heads and intermediate size: the demo
# target SmolLM2-135M has 9 / 3 heads, so only 1 and 3 work for it (2 and 4 are refused
# with a clear error, which this script prints and moves on); for TP 1/2/4 use a target
# such as Qwen3-8B (32 / 8 heads): TARGET=... DRAFTER=... TP_SIZES="1 2 4".
set -uo pipefail
source scripts/gpu/lease_env.sh
T=${TARGET:-/tmp/ddtree-work/cache/smollm2-135m-instruct}
D=${DRAFTER:-models/smollm2-135m-dflash}
TP_SIZES=${TP_SIZES:-"1 2 3 4"}
DRAFTER_GPU=${DRAFTER_GPU:-0}
NUM_PROMPTS=${NUM_PROMPTS:-32}
NUM_AGREE=${NUM_AGREE:-16}
PORT=8000
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee "$OUT/gpus.txt"

for N in $TP_SIZES; do
  if ! python3 - "$T" "$N" <<'PY'
import sys
from pathlib import Path
from ddtree.models.checkpoint import read_config
from ddtree.models.target_config import TargetConfig
from ddtree.models.tensor_parallel import check_shardable
from ddtree.errors import InvalidArgumentError
try:
    check_shardable(TargetConfig.from_hf(read_config(Path(sys.argv[1]))), int(sys.argv[2]))
except InvalidArgumentError as exc:
    print(f"TP {sys.argv[2]}: skipped: {exc}")
    sys.exit(1)
PY
  then continue; fi
  GPUS=$(seq -s, 0 $((N - 1)))
  python3 -m ddtree.cli serve --target "$T" --drafter "$D" --port "$PORT" --mode tree \
    --budget 32 --drafter-gpu "$DRAFTER_GPU" --verifier-gpus "$GPUS" \
    --tensor-parallel-size "$N" >"$OUT/tp${N}_serve.log" 2>&1 &
  SERVE=$!
  python3 - "$PORT" <<'PY'
import sys, time
from ddtree.cli.serve import http_ok
deadline = time.monotonic() + 600
while not http_ok(f"http://127.0.0.1:{sys.argv[1]}/health"):
    assert time.monotonic() < deadline, "ddtree serve not healthy in 600 s"
    time.sleep(1)
PY
  timeout 600 python3 -m ddtree.cli bench --url "http://127.0.0.1:$PORT" --prompts humaneval \
    --num-prompts "$NUM_PROMPTS" --modes ar,tree --budgets 32 --concurrency 1,32 \
    --repeats 2 --max-tokens 256 --no-progress --json-out "$OUT/tp${N}_bench.json" \
    | tee "$OUT/tp${N}_bench.txt"
  python3 - "$T" "$NUM_AGREE" "$OUT/tp${N}_tokens.json" <<'PY'
import json, sys
import grpc
from transformers import AutoTokenizer
from ddtree.prompts import load_named_or_file
from ddtree.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
_, prompts = load_named_or_file("humaneval", int(sys.argv[2]), is_chat=False)
stub = verifier_pb2_grpc.VerifierStub(grpc.insecure_channel("127.0.0.1:50051"))
out = {}
for mode, wire in (("ar", common_pb2.MODE_AR), ("tree", common_pb2.MODE_TREE)):
    for i, text in enumerate(prompts):
        request = verifier_pb2.GenerateRequest(
            request_id=f"{mode}-{i}", prompt_ids=tokenizer(text)["input_ids"], max_tokens=256,
            ignore_eos=True, spec=common_pb2.SpecParams(mode=wire, budget=32))
        out[f"{mode}-{i}"] = [t for r in stub.Generate(request, timeout=300) for t in r.token_ids]
json.dump(out, open(sys.argv[3], "w"))
PY
  kill $SERVE; wait $SERVE 2>/dev/null
done

python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
reference = json.loads((out / "tp1_tokens.json").read_text())
for path in sorted(out.glob("tp*_tokens.json")):
    tokens = json.loads(path.read_text())
    same = sum(tokens[k] == reference[k] for k in reference)
    first = [next((i for i, (a, b) in enumerate(zip(tokens[k], reference[k])) if a != b), None)
             for k in reference]
    diverged = [i for i in first if i is not None]
    print(f"{path.stem}: {same}/{len(reference)} requests equal TP 1's bf16 tokens; "
          f"first divergences at {sorted(diverged)[:8]}")
PY
