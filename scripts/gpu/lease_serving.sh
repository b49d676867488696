#!/usr/bin/env bash
# A serving lease on one warm machine, each call well under 10 minutes. The repository
# (with the 30 MB demo drafter) travels with every call, so the demo target's GGUF comes in
# nine parts (since session 36; eight in session 35, seven before, five before session 34:
# each left ~1 MB of the 64 MiB a call carries as the repository grew): .carry/g0/part0
# (the first 1,000,000 bytes, beside ~10 MB of wheels), then .carry/g1, g2, g3, g3b, g3c,
# g3d, g3e, g4 with part1, part2, part3, part3b, part3c, part3d, part3e, part4 (~12 MB
# each; g1 also holds HumanEval.jsonl.gz; the spec-bench JSONL sit in .carry/spec since
# lease 17)
# (`bash scripts/gpu/make_carry.sh` rebuilds .whl and .carry on a fresh checkout; copy each
# call's returned all<N>.tar into docs/gpu-runs/<date>-lease<NN>/ and commit it at once: the
# files a call returns live outside the checkout and lease 35's went with its session):
#   call 0  carries .whl and .carry/g0 (part0 parked in /tmp)
#   calls 1-3, g3b, g3c, g3d, g3e  carry .carry/g1, .carry/g2, .carry/g3 (call 3 also
#           .carry/spec, for the spec-bench calls), .carry/g3b ... .carry/g3e: park them in
#           /tmp ("after 0-3" below means after all eight staging calls)
#   the work call carries .carry/g4 (part4: stage_target joins the nine and checks them)
#   call 4  carry .carry/g4: join, check the sha256, convert; every mode against ar, the
#           speed table and the round profile (engine_bench.py --stages exact,speed,profile);
#           then ar and tree@32 at concurrency 1 and 8 under continuous load (40 requests per
#           run: at c8 a finished request's row is refilled at once), in process and through
#           `ddtree serve` (`ddtree bench --url`)
#   call 5  the drafter job (scripts/gpu/lease_drafter.sh train, continuing from the
#           committed drafter on new engine data plus the carried packs: carry
#           .carry/drafter-data); SOAK=1 starts the 10-minute soak beside it instead
#   call 6  the new drafter's acceptance table and speed table, then the engine's
#           concurrency curves (engine_bench.py --stages load); with SOAK=1 the soak's report
# Every part prints its start time (seconds into the call) so the next lease can plan.
#   call 7  the committed drafter's table, call 4's load benches again, the load curves
#   call 8  (after 1-3 on a fresh machine) exact with `auto` and the load curves
#   call 9  (fourth session, carry .carry/g4) ar's short round against the generic walk, the
#           remote drafter's round split on the GPU and `ddtree serve` at two GIL switch
#           intervals (DDTREE_GIL_SWITCH_INTERVAL_S)
#   call 10 (warm, after 9) the remote profile again, `ddtree serve` at GIL=0.0002 s
#   call 11 (after 1-3) alternating halves on / off (profile, `ddtree serve` twice each), load curves
#   call 12 (after 1-3) the SwiGLU epilogue bitwise, speed, exact, load curves, continuous
#           load in process and through `ddtree serve` (~300 s: the next session's start)
#   call 14 (fifth session, after 1-3) dependent launches (PDL): the speed table with and
#           without, every mode against ar, the load curves, continuous load in process and
#           through `ddtree serve`, the round profile last
#   call 15 (after 1-3) PDL with and without the L2 prefetches, the demo GEMMs re-tuned
#           under dependent launches (the new table in $OUT) and the speed table, every mode
#           against ar, load curves and continuous load with it
#   call 16 (after 1-3) the Qwen3-8B shapes with and without dependent launches, the round
#           profile and the remote drafter's round split with them
#   call 17 (after 1-3) the prefetch within an L2 budget: the 8B shapes with PDL, without its
#           prefetches and without PDL; the demo's speed table with and without
#   call 18 (after 1-3) the final state of the fifth session: the 8B shapes with and without
#           PDL, speed and exact, load curves, continuous load in process and through
#           `ddtree serve`
#   call 19 (after 1-3; written after lease 7, not yet run) the gateway's merge-when-behind:
#           `ddtree serve` with and without it (DDTREE_MERGE_WHEN_BEHIND=0), twice each,
#           interleaved, one repeat per run
#   call 21 (after 20, warm) `ddtree serve` with one and two gateway processes, twice each,
#           interleaved; the load curves (auto); the 8B shapes with and without the SwiGLU
#           epilogue
#   call 22 (after 1-3) the 8B shapes under three GEMM tilings: the committed table, the
#           table without its 8B entries (the default rule: split-K for the QKV GEMM, as in
#           lease 2), the table with the QKV GEMM split 4 ways; then `ddtree serve` once
#   call 20 (sixth session, after 1-3) the one-kernel tree build and the policy's round
#           cost: speed with the trees built by the kernel and in PyTorch, every mode
#           against ar, the round profile, load curves (auto), continuous load in process
#           and through `ddtree serve`
#   call 23 (seventh session, after 1-3) the load curves cold then warm (graphs captured
#           and auto's measurements counted per run), `auto` beside ar and tree@32 under
#           continuous load in process and through `ddtree serve` (the remote drafter takes
#           each row's tree shape per round; ar's round measured for the policy)
#   call 24 (after 1-3, or warm after 23) `auto` request after request in process (the policy after
#           each), auto under continuous load in process, then ar and auto through `ddtree
#           serve` (the gateway refused `auto` until now)
#   call 25 (after 1-3) the policy on nested acceptance: `auto` request after request, every
#           mode against ar (auto at c1 and c8 included), the load curves cold and warm, ar /
#           tree@32 / auto under continuous load in process and through `ddtree serve`
#   call 26 (after 1-3) which auto samples differ from ar through `ddtree serve` (call 25: one
#           of 40 at c1): ar and auto at c1, twice each (the first auto pass pays the
#           drafter's first compiles), the report's samples compared with ar's
#   call 27 (after 1-3) after the fixes of call 26: `ddtree serve` (its time to healthy, the
#           drafter's start-up warm-up), ar / tree@32 / auto at c1 and c8 through it, each
#           sample compared with ar's, the drafter losses counted
#   call 28 (eighth session, after 1-3) where the hop's time goes: the remote drafter's round
#           split at 1 and 8 rows with cProfile and a torch.profiler trace of 12 rounds each
#           (GPU busy vs idle, scripts/trace_summary.py), then the 8B shapes (floor without the
#           embedding table too) and a trace of their ar steps and tree@63 rounds
#   call 29 (warm, after 28) the invariant GEMM at the 8B shapes: committed tilings against a
#           sweep, T = 1 and 64, against the copy bandwidth (scripts/gpu/gemm_sweep.py)
#   call 30 (after 1-3) the RMSNorm's grouped loads and the 8B tilings of call 29: the remote
#           round's split and trace (no cProfile: Python 3.12 allows one per process, the
#           drafter's thread failed in call 28), every mode against ar, speed, the 8B shapes
#   call 31 (nothing staged: random 8B weights) the 8B shapes' kernel trace after call 30
#   call 32 (after 1-3) the eighth session's state: the 8B shapes (tree@63 in a 63-node
#           bucket), speed with transformers beside, every mode against ar, then `ddtree
#           serve`: ar / tree@32 / auto at c1 and c8, each sample compared with ar's
#   call 33 (warm, after 32) the load curves (engine_bench.py --stages load)
#   call 34 (after 1-3; ran at 8bdfee9, the kernel is removed since) tree attention with
#           several queries per program (a tree's nodes
#           read their shared prefix once): every mode against ar, speed, the 8B shapes with
#           and without it (DDTREE_GROUPED_ATTENTION=0)
#   call 35 (ninth session, after 1-3) the gateway's shared GenerateMany stream against a
#           Generate call per generation: `ddtree serve` (shared, port 8000) with a second
#           gateway on port 8001 (--no-shared-stream) over the same verifier and drafter; ar
#           and tree@32 at c1 and c8 through each, interleaved, every sample against ar, and
#           the CPU seconds of the verifier, drafter, gateways and the bench per point
#   call 36 (after 1-3) the policy's TREE_MARGIN and the shared stream as a user runs them:
#           `ddtree serve` ar / tree@32 / auto at c1 and c8, each sample against ar
#   call 37 (warm, after 36) the load curves with TREE_MARGIN (engine_bench.py --stages load)
#   call 38 (after 0-3) the ninth session's final state: ar / tree@16 / tree@32 at c1 and c8
#           in process (continuous load), then `ddtree serve` with auto beside them (the
#           policy's cost bounds behind the hop), every sample against ar
#   call 39 (after 0-3) the verifier's GIL switch interval with the shared stream: a
#           gateway and an ar verifier (no drafter), restarted at 5 ms and 0.5 ms twice,
#           ar at c8 through them (TTFT: 20-40 ms through the services, 3.4 in process)
#   call 40 (after 0-3; written after lease 11, not yet run) where the first token's time
#           goes through the services: scripts/profile_ttft.py (GenerateMany, Generate and
#           HTTP through the gateway, alone and beside 7 streams), shared stream and not
#   call 41 (tenth session, after 0-3; ran at 45b35d0 plus a RoPE kernel of one program a
#           row, both not kept: DDTREE_SPLIT_PROGRAMS and the "every split" variant are gone)
#           tree attention's programs walking several splits (a grid sized from T, not
#           max_kv_len): the kernels' GPU checks, every mode against ar, speed with the old
#           grid beside, the round profile at batch 1 and 8
#   call 42 (after 0-3, as 41) ar / tree@16 / tree@32 at c1 and c8 in process, tree@32
#           also at DDTREE_SPLIT_PROGRAMS 2048 and with the old grid
#   call 43 (warm, after 42) `ddtree serve`: ar / tree@16 / tree@32 / auto at c1 and c8,
#           every sample against ar
#   call 44 (nothing staged but .whl) whether the GEMM may pick BLOCK_M / BLOCK_N from the
#           rows: scripts/gpu/gemm_rows_sweep.py at the demo shapes, T = 1 / 33 / 132 / 264
#   call 45 (after 0-3) the GEMM's row tiles (ddtree/kernels/linear_rows.json): the kernels'
#           GPU checks, then ar / tree@16 / tree@32 at c1 and c8 in process with them, and
#           tree@16 / tree@32 without (DDTREE_ROW_TILES=0), every sample against ar
#   call 46 (after 0-3; written in the tenth session, not yet run) `ddtree serve
#           --colocate-drafter` (the drafter inside the verifier: two processes, no hop)
#           against the three-process default: ar / tree@16 / auto at c1 and c8
#           through each, every sample against ar, the start-up time of each; ran in
#           lease 13 (eleventh session) before and after the warm-up of every shape
#   call 47 (after 0-3 or warm; not yet run) where a round of 8 trees spends its time, with
#           true kernel durations: the round profile without dependent launches
#           (DDTREE_PDL=0: under PDL a kernel's trace duration includes its wait for the
#           previous one), kernel table per (mode, batch) in $OUT/profile_kernels.txt
#   call 48 (eleventh session, warm after 46) ar / tree@16 at c1 and c8 in process, the
#           same lease as call 46's services (ratios side by side)
#   call 49 (after 0-3) call 48, then call 46: in process, colocated and three processes
#           on one machine, after the warm-up of every shape
#   call 50 (after 0-3; written in the eleventh session, not yet run) the drafter service's
#           warm-up shape by shape (scripts/gpu/warmup_timing.py), against an empty Triton
#           cache and again with it (lease 13: 113-149 s for 56 shapes, where the colocated
#           verifier warmed the same drafting graphs and its own in 30-51 s)
#   call 51 (warm after 50; not yet run) why colocated ar at c8 ran below the three
#           processes in all three runs of lease 13, which always ran colocated first: ar at
#           c1 and c8 through the three processes first, then colocated (Triton's cache of
#           call 50 for both)
#   call 52 (twelfth session, after 0-3) the drafter's vocabulary top-K in two Triton
#           kernels (ddtree/kernels/vocab_topk.py): its GPU checks and timings against
#           torch.topk, then the speed stage (ar / tree@16 / tree@32 at batch 1, with it and
#           with torch.topk, transformers' static cache in the same run)
#   call 53 (warm after 52) 160 HumanEval requests a point instead of 40 (at c8 40 requests
#           are 0.8 s, five a stream: the ramp and the drain weigh on the ratio): in process
#           ar / tree@16, then `ddtree serve --colocate-drafter` ar / tree@16 / auto (auto
#           now judges ar by ar's traffic rounds), c1 and c8, every sample against ar
#   call 54 (warm after 53) the same through the three processes
#   call 55 (warm after 54) in process ar / tree@32 / auto, 160 requests, c1 and c8
#   call 56 (after 0 alone) call 52's kernel checks and timings (`check_kernels.py --only
#           vocab_topk`), both selections (bitonic and K rounds) side by side
#   call 57 (after 1-3 on 56's machine) call 52's speed stage, the selection chosen by K
#   call 58 (after 0-3; written in the twelfth session) call 53's colocated point again
#           with two client processes (`ddtree bench --client-processes 2`: at ar c8 one
#           client used 0.9 of a core in lease 14); call 59 (warm after 58) call 54's
#           three-process point the same way
#   call 60 (after 0 alone: random 8B weights; thirteenth session) the Qwen3-8B shapes with
#           and without the fused norm / SwiGLU prologues (measured slower only at the demo's
#           launch-bound sizes, lease 5), then their kernels without dependent launches
#   call 61 (after 0 alone; ran at 270808c: its DDTREE_ATTN_SPLIT is gone since, and with it
#           the bodies of calls 61-63 and 65: git show 270808c / c361a88) the 8B shapes at
#           tree attention's split sizes 256 / 128 / 64 (lease 15's 8B ar step spent 23.7 us
#           a layer in the split kernel for one query at 512 keys); calls 62-63 (not run)
#           the demo's speed and exact stages at those split sizes
#   call 64 (after 0 alone) tree attention's (BLOCK_N, warps, stages) per head dim:
#           scripts/gpu/attn_sweep.py (each candidate's tree queries against their ar twins,
#           then graph replay at decode, one tree and a batch of trees)
#   call 65 (warm after 64; ran at c361a88, whose DDTREE_ATTN_TILES is gone since) the 8B
#           shapes with the committed tiles and with TILES (e.g. TILES=128=64/8/3)
#   call 66 (after 0-3; fourteenth session) the twin checks of four tilings across key
#           blocks and splits (attn_sweep.py --twins), then the exact stage over 40 prompts
#           with the drafter's tree attention at 64/2/2 and the target's committed, the
#           other way round, and both: which side made lease 15's 2 samples leave ar
#   call 66b (after 0-3) lease 15's in-process bench (40 requests, continuous load) with
#           the demo head dim's tree attention at 64/2/2, committed, 64/2/2
#   call 67 (after 0-3) after lease 16's fixes: the exact stage (16 prompts), the speed
#           table beside transformers, 160 requests in process (ar / tree@16 / auto)
#   call 68 (after 0-3) colocated, ar / tree@16, 160 requests, two gateway processes then one
#   calls 69-72 (lease 17: the last-program reduce, tree attention's group kernel) are gone
#           with the switches they measured (docs/performance.md, fifteenth session)
#   calls 73-75 (lease 18) the engine's closed loop in process and through a drafter
#           service, `ddtree bench` in process, the gateway in both placements (40 requests)
#   call 76 (after 0-3; seventeenth session) call 75's engine loops, then `ddtree bench`
#           in process (lease 19 ran it with the prefill's drafter context A/B, gone since); call 77 (warm) three processes, call 78 (warm) colocated: ar / tree@16
#           c1 / c8 through the gateway, 160 requests, two client processes; call 80
#           call 77 again (--max-num-seqs 8); call 81 (after 0-3) alternating halves
#           through a drafter service A/B; call 82 (no staging) the GEMM row tiles at the
#           prefill's token buckets
#   call 83 (after 0-3 with py-spy's wheel in .whl; eighteenth session) the three processes
#           at tree@16 c8 / c1 with py-spy on each (SPY_ARGS=--gil: the GIL's holder only)
#   call 84 (after 0-3; nineteenth session) the next trees asked for right after each
#           harvest (EngineConfig.send_ahead) A/B through a drafter service, then the three
#           processes with it: tree@16 and ar at c8 / c1, 160 requests; call 85 (warm, after
#           84) the three processes without it (DDTREE_SEND_AHEAD=0), tree@16 c8 / c1, then
#           `ddtree bench` in process (ar, tree@16; 160 requests); call 86 (after 0-3) 84's
#           and 85's serving points on one machine (the trees now asked for before the
#           round's results are built), the drafter's ContextGraphs A/B, then the
#           in-process engine traced at tree@16 c1 / c8 (it ran out of time); call 87
#           (after 0-3) send-ahead A B B A and ContextGraphs A B through the three
#           processes; call 88 (after 0-3) the in-process trace at tree@16 c1 / c8
#   calls 89-90 (lease 23, twentieth session, warm after 87) ContextGraphs on then off;
#           tree@16 and ar at c8 / c1 with both defaults; call 91 (lease 24, after 0-3)
#           issue 8's ratios on one machine: `ddtree serve`, in process, the speed table;
#           call 92 (after 0-3; lease 25, REMOTE_ONLY=1) the engine traced through a drafter service
#           and in process at tree@16 c1 / c8
#   call 93 (twenty-first session, lease 26, after 0-3) py-spy on the drafter and verifier
#           under `ddtree serve` (tree@16 c8 / c1) and the remote round's split; calls 94 (lease
#           27, after 0-3) and 95 (lease 28, stages when fresh) the Draft stream over the
#           drafter's Unix socket against gRPC through `ddtree serve`, both orders, and in process;
#           call 96 (lease 29, after 0-3) py-spy on both at tree@16 c8 once traffic runs
#   calls 97-155: each one's comment below says what it measures and what it follows
#   calls r156, r157 (thirty-seventh session; no staging: carry .whl and .carry/rand, ~0.7
#           MB, the demo target's config and tokenizer) a random-weight target of the demo's
#           shapes built on the host (scripts/gpu/random_target.py): MPS's cost apart in
#           process (r156: without MPS, as the only client, beside an idle client;
#           scripts/gpu/under_mps.py), then ar c8 through `ddtree serve` as MPS clients,
#           without MPS, colocated, and with no drafter (`--mode ar`) as the only MPS
#           client and without MPS (r157, warm after r156)
#   call r158 (thirty-eighth session) r156 and r157 cut to fit one call (one machine start)
#   call r159 (thirty-ninth session) ar c8 through serve: this gateway against .basegw's
#   call r161 (thirty-ninth session) ar's device time a round in process and through serve
# Usage: bash scripts/gpu/lease_serving.sh 0|1|...|156|r156|r157|r158|r159|r161|164|165|r166|r170|r171   (results under $OUT)
set -uo pipefail
source scripts/gpu/lease_env.sh
T=/tmp/ddtree-cache/smollm2-135m-instruct
H=/tmp/HumanEval.jsonl.gz
D=models/smollm2-135m-dflash
R=/tmp/rand-target  # calls r156, r157: scripts/gpu/random_target.py from .carry/rand

wait_healthy() {  # pid log
  for _ in $(seq 1 800); do
    kill -0 "$1" 2>/dev/null || { tail -20 "$2"; return 3; }
    curl -sf http://127.0.0.1:8000/health >/dev/null && return 0
    sleep 0.5
  done
  echo "ddtree serve not healthy in 400 s"; return 3
}

CALL_START=$(date +%s)
mark() { echo "== [$(( $(date +%s) - CALL_START )) s] $*"; }

load_bench() {  # extra bench arguments...
  # 40 requests per run (the first 40 HumanEval problems), 256 tokens, 2 repeats: at c8 a
  # finished request's row is refilled at once (continuous load, as a serving bench runs).
  timeout 280 python3 -m ddtree.cli bench "$@" --prompts humaneval --num-prompts 40 \
    --num-requests 40 --modes "${MODES:-ar,tree}" --budgets 32 --concurrency 1,8 \
    --repeats "${REPEATS:-2}" --max-tokens 256 --no-progress
}

stage_target() {  # the GGUF from its nine parts (all but part4 parked in /tmp) -> the HF
  # checkpoint $T (pull_smollm2 checks the GGUF's sha256)
  cat /tmp/part0 /tmp/part1 /tmp/part2 /tmp/part3 /tmp/part3b /tmp/part3c /tmp/part3d \
    /tmp/part3e .carry/g4/part4 \
    > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "
from pathlib import Path
from ddtree.demo.pull import pull_smollm2
print(pull_smollm2(Path('/tmp/ddtree-cache'), progress=False, gguf=Path('/tmp/SmolLM2-135M-Instruct.Q4_1.gguf')))" 2>&1 | tail -1
}

start_serve() {  # [tag]: `ddtree serve` in the background (its pid in S), once healthy
  python3 -m ddtree.cli serve --target $T --drafter $D --port 8000 --device cuda \
    --dtype bfloat16 --gateway-workers "${GATEWAY_WORKERS:-1}" ${SERVE_ARGS:-} \
    >"$OUT/serve${1:-}.log" 2>&1 &
  S=$!
  wait_healthy $S "$OUT/serve${1:-}.log"
}

serve_bench() {  # [tag]: `ddtree serve`, then load_bench through it, its metrics, and stop it
  local tag=${1:-}
  start_serve "$tag" || return 3
  mark bench url $tag
  load_bench --url http://127.0.0.1:8000 2>&1 | tee "$OUT/bench_url$tag.txt" | tail -7
  curl -s http://127.0.0.1:8000/metrics | grep -E "^(ddtree|vllm):(batch_size|num_|kv|target_forwards|rounds)" > "$OUT/metrics$tag.txt"
  kill $S; wait $S 2>/dev/null
}

curves_and_serving() {  # load curves, continuous load in process and through `ddtree serve`
  mark load curves
  timeout 150 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | tail -17
  mark bench in process
  load_bench --target $T --drafter $D 2>&1 | tee "$OUT/bench_inprocess.txt" | tail -5
  serve_bench || return 3
  (cd "$OUT" && tar -cf services.tar serve*.log metrics*.txt && rm -f serve*.log metrics*.txt)
}

bench_inprocess() {  # modes budgets report.json: NUM (40) HumanEval requests x 256 tokens
  # in process at c1 and c8 (continuous load), its table rows
  timeout "${BENCH_TIMEOUT:-150}" python3 -m ddtree.cli bench --target $T --drafter $D \
    --prompts humaneval --num-prompts "${NUM:-40}" --num-requests "${NUM:-40}" \
    --modes "$1" --budgets "$2" --concurrency 1,8 \
    --max-tokens 256 --no-progress --json-out "$3" 2>&1 | grep humaneval
}

serve_against_ar() {  # `ddtree serve` (its time to healthy, the drafter's warm-up), ar /
  # tree@BUDGETS (default 32) / auto at c1 and c8 through it, each sample compared with
  # ar's, drafter losses
  mark serve
  start_serve || return 3
  mark healthy
  grep -o '"node_buckets.*seconds": [0-9.]*' "$OUT/serve.log"
  timeout "${SERVE_BENCH_TIMEOUT:-300}" python3 -m ddtree.cli bench --url \
    http://127.0.0.1:8000 --prompts humaneval --num-prompts 40 --num-requests 40 \
    --modes ar,tree,auto --budgets "${BUDGETS:-32}" --concurrency 1,8 --max-tokens 256 \
    --no-progress --json-out "$OUT/report.json" 2>&1 | tail -10
  python3 scripts/gpu/ar_mismatches.py "$OUT/report.json" | cut -c1-600 | tail -4
  kill $S; wait $S 2>/dev/null
  echo "drafter lost / fallbacks: $(grep -c 'drafter_lost\|fallback' "$OUT/serve.log")"
}

placements_bench() {  # "placement..." bench-args...: `ddtree serve` in each placement in
  # turn (colocated: --colocate-drafter; services: three processes), its warm-up lines, NUM
  # (40) HumanEval requests x 256 tokens through it, each sample against ar; reports and
  # logs in $OUT/raw.tar.gz
  local placements=$1; shift
  for placement in $placements; do
    mark "serve ($placement)"
    SERVE_ARGS="$([ $placement = colocated ] && echo --colocate-drafter) ${EXTRA_SERVE:-}" \
      start_serve "_$placement" || return 3
    mark "healthy ($placement)"
    grep -h warmed_up "$OUT/serve_$placement.log" | cut -c1-200
    timeout "${BENCH_TIMEOUT:-170}" python3 -m ddtree.cli bench --url http://127.0.0.1:8000 \
      --prompts humaneval --num-prompts "${NUM:-40}" --num-requests "${NUM:-40}" \
      --max-tokens 256 --no-progress --client-processes "${CLIENTS:-1}" "$@" \
      --json-out "$OUT/report_$placement.json" 2>&1 | grep humaneval
    python3 scripts/gpu/ar_mismatches.py "$OUT/report_$placement.json" | tail -1 | cut -c1-300
    kill $S; wait $S 2>/dev/null
  done
  (cd "$OUT" && tar -czf raw.tar.gz report_*.json serve_*.log && rm -f report_*.json serve_*.log)
}

bench_url() {  # mode budget concurrency report.json: NUM (160) HumanEval requests of MAXTOK
  # (256) tokens through `ddtree serve` on port 8000, CLIENTS (2) client processes; its row
  timeout 150 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts "${NUM:-160}" --num-requests "${NUM:-160}" --max-tokens "${MAXTOK:-256}" \
    --no-progress --client-processes "${CLIENTS:-2}" --modes "$1" --budgets "$2" \
    --concurrency "$3" --json-out "$4" 2>&1 | grep humaneval
}

cpu_snapshot() {  # "name jiffies" for each process in $OUT/pids (user + system) and for
  # the whole machine (busy: all but idle and iowait), one a line
  local f
  for f in "$OUT"/pids/*.pid; do
    echo "$(basename "$f" .pid) $(awk '{print $14 + $15}' /proc/"$(cat "$f")"/stat 2>/dev/null || echo 0)"
  done
  awk '/^cpu /{print "machine", $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat
}

bench_url_timed() {  # mode budget concurrency report.json: bench_url, then the CPU each
  # process in $OUT/pids and the machine used over the run, and the means of /metrics'
  # verifier -> gateway timings and TTFT (cumulative since serve started; the scrape is kept
  # in $OUT/metrics.txt)
  cpu_snapshot > /tmp/cpu_before
  python3 scripts/gpu/thread_cpu.py snap "$OUT"/pids/*.pid > /tmp/threads_before.json
  local svc
  for svc in verifier gateway; do  # the threads' names by id (threads.txt has only ids)
    [ -x /tmp/site/bin/py-spy ] && timeout 20 /tmp/site/bin/py-spy dump --nonblocking \
      --pid "$(cat "$OUT/pids/$svc.pid")" >> "$OUT/dump_$svc.txt" 2>&1
  done
  local began=$(date +%s.%N)
  bench_url "$@"
  cpu_snapshot | paste /tmp/cpu_before - \
    | awk '{printf "%s cpu %.2f s, ", $1, ($4 - $2) / 100} END {print ""}' | tee -a "$OUT/cpu.txt"
  python3 scripts/gpu/thread_cpu.py snap "$OUT"/pids/*.pid > /tmp/threads_after.json
  echo "== $4" >> "$OUT/threads.txt"
  python3 scripts/gpu/thread_cpu.py diff /tmp/threads_before.json /tmp/threads_after.json \
    "$(python3 -c "import time; print(time.time() - $began)")" "$OUT"/dump_*.txt | tee -a "$OUT/threads.txt" | cut -c1-400
  curl -s http://127.0.0.1:8000/metrics | tee -a "$OUT/metrics.txt" \
    | grep -E "^ddtree:(request_prepare|verifier_start|verifier_first_token|verifier_read|verifier_hop|delivery|time_to_first_token)_seconds_(sum|count)" \
    | awk '{split($1, a, "{"); v[a[1]] = $2} END {for (k in v) if (k ~ /_count/) {b = k; sub(/_count/, "", b); printf "%s %d x %.2f ms (cumulative)\n", b, v[k], 1000 * v[b "_sum"] / v[k]}}'
}

setting_runs() {  # tag run...: `ddtree serve` (SERVE_ARGS + --pid-dir; the caller's env
  # picks the setting), each run mode:budget:concurrency through it with bench_url_timed,
  # then this serve's metrics, thread CPU and py-spy dumps moved into $OUT/<tag>/
  local tag=$1 run mode budget c; shift
  SERVE_ARGS="${SERVE_ARGS:-} --pid-dir $OUT/pids" start_serve _$tag || return 3
  rm -f "$OUT"/dump_*.txt  # this serve's threads
  for run in "$@"; do
    IFS=: read -r mode budget c <<< "$run"
    mark "$mode@$budget c$c through serve ($tag)"
    bench_url_timed $mode $budget $c "$OUT/report_${tag}_${mode}_c${c}_$(date +%s).json"
  done
  kill $S; wait $S 2>/dev/null
  (cd "$OUT" && mkdir -p "$tag" && mv metrics.txt threads.txt cpu.txt dump_*.txt "$tag/" \
    2>/dev/null; gzip -f "serve_$tag.log")
}

spy_start() {  # rate tag svc...: py-spy on each service for SPY_SECONDS (8) s, SPY_DELAY
  # (4) s from now, idle threads too unless SPY_IDLE=0 (then a sample is CPU work: a bench
  # whose client takes its time to start is covered whole by a long recording), into
  # $OUT/spy_<tag>_<svc>.txt (raw stacks); the samplers' pids in SPIES
  SPIES=""
  local rate=$1 tag=$2 svc idle=--idle; shift 2
  [ "${SPY_IDLE:-1}" = 0 ] && idle=""
  for svc in "$@"; do
    (sleep "${SPY_DELAY:-4}"; timeout 60 /tmp/site/bin/py-spy record \
      --pid "$(cat $OUT/pids/$svc.pid)" --duration "${SPY_SECONDS:-8}" --rate "$rate" \
      --nonblocking $idle --threads --format raw -o "$OUT/spy_${tag}_$svc.txt" >/dev/null 2>&1) &
    SPIES="$SPIES $!"
  done
}

spy_summaries() {  # tag svc...: once the samplers are done, each service's summary (head)
  local tag=$1 svc; shift
  wait $SPIES
  for svc in "$@"; do
    python3 scripts/gpu/spy_summary.py "$OUT/spy_${tag}_$svc.txt" --top 30 --threads 4 \
      > "$OUT/spy_${tag}_${svc}_summary.txt" 2>&1
    head -3 "$OUT/spy_${tag}_${svc}_summary.txt"
  done
}

closed_loop_curves() {  # ar and auto in process under a closed loop (`ddtree bench`: a
  # finished request's worker sends the next at once), c1 / c8 / c32 / c64, HumanEval x 256
  # tokens, 4 s a point after one warm-up request per worker, one engine for the grid;
  # each sample compared with ar's
  mark "curves, continuous load"
  timeout 280 python3 -m ddtree.cli bench --target $T --drafter $D --prompts humaneval \
    --num-prompts 164 --num-requests 2000 --duration 4 --modes ar,auto \
    --concurrency 1,8,32,64 --max-tokens 256 --no-progress \
    --json-out "$OUT/report_curves.json" 2>&1 | grep -E "humaneval|Error|error" | tail -12
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_curves.json" | tail -2 | cut -c1-300
}

serve_ahead() {  # ahead "mode:budget:c ..." [context_graphs 0|1]: `ddtree serve --budget 16
  # --max-budget 16 --max-num-seqs 8` with DDTREE_SEND_AHEAD=ahead (the verifier) and
  # DDTREE_CONTEXT_GRAPHS (the drafter service), each point (160 HumanEval requests x 256
  # tokens, two client processes: one prompt set at every point) through it
  # SOCK=0: the verifier speaks the Draft stream over gRPC, not the drafter's Unix socket;
  # SHARED=0: no shared draft link (the Draft stream instead)
  # SERVE_EXTRA: more `ddtree serve` arguments (the last of a repeated flag wins); NUM
  # requests (160) of MAXTOK tokens (256) at each point
  local ahead=$1 ctx=${3:-0} point mode budget c tag sock=${SOCK:-1} shared=${SHARED:-1}
  tag=ahead${1}_ctx${ctx}_sock${sock}_shared${shared}${RUN:+_$RUN}
  mark "serve (services, --max-budget 16 --max-num-seqs 8), send_ahead=$ahead context_graphs=$ctx socket=$sock shared=$shared"
  DDTREE_SEND_AHEAD=$ahead DDTREE_CONTEXT_GRAPHS=$ctx DDTREE_DRAFTER_SOCKET=$sock \
    DDTREE_DRAFTER_SHARED=$shared \
    SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 ${SERVE_EXTRA:-}" start_serve _$tag \
    || return 3
  grep -h warmed_up "$OUT/serve_$tag.log" | cut -c1-200
  grep -ho "transport=[a-z]*\|\"transport\": \"[a-z]*\"\|drafter_link.*\|shared_draft_[a-z]*" "$OUT/serve_$tag.log" | cut -c1-160 | sort | uniq -c
  for point in $2; do
    IFS=: read -r mode budget c <<<"$point"
    mark "$mode@$budget c$c, ${NUM:-160} requests, $tag"
    bench_url "$mode" "$budget" "$c" "$OUT/report_${tag}_${mode}_c$c.json"
  done
  local ar_reports=("$OUT"/report_*_ar_c*.json)  # the call's ar reports (texts)
  if [ -e "${ar_reports[0]}" ]; then
    for point in "$OUT"/report_${tag}_*.json; do
      echo "$(basename "$point"): $(python3 scripts/gpu/ar_mismatches.py "$point" \
        "${ar_reports[@]}" | tail -1)"
    done
  fi
  curl -s http://127.0.0.1:8000/metrics | grep -E "batch_size|fallback" \
    | grep -v "^#" > "$OUT/metrics_$tag.txt"
  kill $S; wait $S 2>/dev/null
  echo "drafter fallbacks: $(grep -c 'fallback' "$OUT/serve_$tag.log")"
  gzip -f "$OUT/serve_$tag.log"
}

ar8() {  # tag [under_mps.py args]: ar c8 in process, 160 requests (report_ar8_<tag>_*);
  # tags off / nopdl_off run without MPS, the others under scripts/gpu/under_mps.py
  local tag=$1; shift
  mark "ar c8 in process: $tag"
  if [ "$tag" = off ] || [ "$tag" = nopdl_off ]; then set -- env; else
    set -- python3 scripts/gpu/under_mps.py "$@" --; fi
  timeout 120 "$@" python3 -m ddtree.cli bench --target $T --drafter $D --prompts humaneval \
    --num-prompts 160 --num-requests 160 --modes ar --concurrency 8 --max-tokens 256 \
    --no-progress --json-out "$OUT/report_ar8_${tag}_$(date +%s).json" 2>&1 \
    | grep -E "humaneval|MPS|rror"
}

gateway_c8() {  # "serve runs" "in-process modes" call: the demo target at c8 through
  # `ddtree serve` as MPS clients (the default; each run mode:budget:8, auto's trees of
  # 16), then in process (no MPS) each mode, 160 HumanEval requests x 256 tokens a run;
  # the stage summary last
  [ -f $T/config.json ] || stage_target
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" setting_runs mps $1 || exit 3
  local mode
  for mode in $2; do
    mark "$mode c8 in process"
    timeout 120 python3 -m ddtree.cli bench --target $T --drafter $D --prompts humaneval \
      --num-prompts 160 --num-requests 160 --modes $mode --budgets 16 --concurrency 8 \
      --max-tokens 256 --no-progress \
      --json-out "$OUT/report_inprocess_${mode}_c8_$(date +%s).json" 2>&1 | grep humaneval
  done
  summary_and_pack $3
}

mps_apart() {  # MPS's cost apart (lease 44: ar c8 in process as the only MPS client -1.2%,
  # through serve beside the drafter -3.5%): a graph's replay and ar c8 in process (160
  # requests) without MPS, as the only client, beside an idle second client (a context
  # holding 1 GB, as the drafter while ar is served; or held to 25% of the SMs), in one
  # order then the other; with MPS_NOPDL=1 ar c8 without PDL, without MPS and as a client
  mark "a graph's replay + copy + wait: without MPS, as the only client, beside an idle one"
  python3 scripts/gpu/sync_latency.py
  python3 scripts/gpu/under_mps.py -- python3 scripts/gpu/sync_latency.py
  python3 scripts/gpu/under_mps.py --idle-clients 1 -- python3 scripts/gpu/sync_latency.py
  # MPS_RUNS cuts the list (a small budget: "off mps mps_idle")
  local run
  for run in ${MPS_RUNS:-off mps mps_idle mps_idle25 mps_idle mps off}; do
    case $run in  # mps_idle25: the idle client held to 25% of the SMs
      mps_idle) ar8 mps_idle --idle-clients 1 ;;
      mps_idle25) ar8 mps_idle25 --idle-clients 1 --idle-percentage 25 ;;
      *) ar8 $run ;;
    esac
  done
  if [ "${MPS_NOPDL:-0}" = 1 ]; then
    DDTREE_PDL=0 ar8 nopdl_off
    DDTREE_PDL=0 ar8 nopdl_mps
  fi
}

pack_all() {  # call: every JSON report and trace under $OUT gzipped, then all of $OUT in
  # one all$1.tar (a call returns at most ~14 files)
  (cd "$OUT" && gzip -f report_*.json trace_*.json 2>/dev/null; tar -cf "all$1.tar" ./* \
    && find . -mindepth 1 ! -name "all$1.tar" -delete)
}

summary_and_pack() {  # call: the stage summary of every report (stage_summary.txt, printed),
  # then all of $OUT in one all$1.tar
  (cd "$OUT" && python3 "$OLDPWD/scripts/gpu/stage_summary.py" report_*.json) \
    | tee "$OUT/stage_summary.txt"
  pack_all $1
  mark done
}

speed_table() {  # variants [extra engine_bench args...]: the batch-1 table of ar, linear,
  # tree@16, tree@32 and shadow@16 in those variants (engine_bench.py --speed-variants)
  local variants=$1; shift
  timeout 260 python3 scripts/gpu/engine_bench.py --stages speed \
    --speed-modes ar,linear,tree@16,tree@32,shadow@16 --speed-variants "$variants" "$@" \
    --target $T --humaneval $H 2>&1 | grep -E "tok/s|Error|error" | grep -v Warn | tail -24
}

exact_modes() {  # every mode against ar at c1 and c8 (engine_bench.py --stages exact)
  timeout 150 python3 scripts/gpu/engine_bench.py --stages exact --target $T \
    --humaneval $H 2>&1 | grep -E " c[18]: |Error|error" | grep -v Warn | tail -20
}

shapes8b_runs() {  # flag...: the Qwen3-8B shapes once per flag (- for none), in that order
  local i=0
  for f in "$@"; do
    i=$((i + 1)); mark "shapes8b $f"
    timeout 110 python3 scripts/gpu/engine_bench.py --stages shapes8b \
      $([ "$f" = - ] || echo "--$f") --target $T --humaneval $H 2>&1 \
      | grep -v Warn | grep -E "^8B|Error"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_${i}_${f}.json"
  done
}

trace_local() {  # trace_engine args...: the engine in process under continuous load (40
  # requests, c1 and c8); $OUT/trace_engine_local.json, a trace renamed *_local.*
  mark "trace_engine in process"
  timeout "${TRACE_TIMEOUT:-200}" python3 scripts/gpu/trace_engine.py --target $T --drafter $D --humaneval $H \
    --concurrency 1,8 --requests 40 "$@" 2>&1 | grep "^trace_engine\|median\|steps"
  mv "$OUT/trace_engine.json" "$OUT/trace_engine_local.json"
  for f in "$OUT"/trace_*_deferred.*; do [ -e "$f" ] && mv "$f" "${f/deferred/local}"; done
}

trace_remote() {  # trace_engine args...: tree@16 through a drafter service of its own (the
  # three processes' verifier engine without the gateway); $OUT/trace_engine_remote.json
  mark "drafter service"
  python3 -m drafter_svc --drafter $D --target $T --port 50052 --device cuda \
    --dtype bfloat16 --max-sessions 8 --max-budget 16 >"$OUT/drafter.log" 2>&1 &
  local ds=$!
  for _ in $(seq 1 300); do grep -q drafter_serving "$OUT/drafter.log" && break; sleep 0.5; done
  mark "trace_engine through the drafter service"
  timeout 150 python3 scripts/gpu/trace_engine.py --target $T --drafter $D --humaneval $H \
    --modes tree@16 --concurrency 1,8 --requests 40 --drafter-addr 127.0.0.1:50052 "$@" \
    2>&1 | grep "^trace_engine\|median\|steps"
  mv "$OUT/trace_engine.json" "$OUT/trace_engine_remote.json"
  for f in "$OUT"/trace_*_deferred.*; do [ -e "$f" ] && mv "$f" "${f/deferred/remote}"; done
  kill $ds; wait $ds 2>/dev/null
}

bench_inprocess_checked() {  # ar / tree@16 in process (40 requests), each sample against ar's
  mark "bench in process"
  NUM=40 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-300
  (cd "$OUT" && gzip report_inprocess.json)
}

remote_profile() {  # [args]: the remote drafter's round split on the GPU (one process, loopback gRPC)
  PYTHONPATH=.:$PYTHONPATH timeout 150 python3 scripts/profile_remote_drafter.py --device cuda \
    --dtype bfloat16 --target $T --drafter $D --rows 1,4,8 --rounds 60 --prompt-len 128 "$@"
}

cpu_s() {  # pid...: user + system CPU seconds of each process so far, space-separated
  for pid in "$@"; do
    awk -v t="$(getconf CLK_TCK)" '{split($0, a, ") "); split(a[2], f, " ");
      printf "%.2f ", (f[12] + f[13]) / t}' "/proc/$pid/stat" 2>/dev/null || printf "nan "
  done
}

bench_point() {  # port mode concurrency tag: one bench point, with each process's CPU seconds
  local pids="$(cat $OUT/pids/verifier.pid) $(cat $OUT/pids/drafter.pid) $(cat $OUT/pids/gateway.pid) $G2"
  local before after start end
  before=$(cpu_s $pids); start=$(date +%s.%N)
  local TIMEFORMAT="bench_cpu_s %U %S"
  { time timeout 200 python3 -m ddtree.cli bench \
    --url "http://127.0.0.1:$1" --prompts humaneval --num-prompts 40 --num-requests 40 \
    --modes "$2" --budgets 32 --concurrency "$3" --max-tokens 256 --no-progress \
    --json-out "$OUT/report_$4.json" >"$OUT/bench_$4.txt" 2>&1 ; } 2>>"$OUT/bench_$4.txt"
  end=$(date +%s.%N); after=$(cpu_s $pids)
  python3 - "$4" "$start" "$end" "$before" "$after" "$OUT/report_$4.json" "$OUT/bench_$4.txt" <<'PY'
import json, sys
tag, start, end, before, after, report, log = sys.argv[1:]
wall = float(end) - float(start)
used = [float(b) - float(a) for a, b in zip(before.split(), after.split())]
bench = next((l.split()[1:] for l in open(log) if l.startswith("bench_cpu_s")), ["nan", "nan"])
row = json.load(open(report))["rows"][0]
names = ["verifier", "drafter", "gateway(8000)", "gateway(8001)"]
cpu = " ".join(f"{n} {u / wall:.2f}" for n, u in zip(names, used) if u == u)
print(f"{tag:<16} {row['output_throughput']['median']:>9.1f} tok/s  tau "
      f"{row['acceptance_length']:.2f}  ttft p50 {row['latency_ms']['ttft']['p50']:.1f} ms  "
      f"itl p50 {row['latency_ms']['itl']['p50']:.2f} ms  cores: {cpu} "
      f"bench {(float(bench[0]) + float(bench[1])) / wall:.2f}")
PY
}

case "${1:?call number}" in
76)
  # (ran at 9caa371, whose prefill stored the drafter's first context in its graph and
  # trace_engine --eager-context A/B'd it; both gone since: git show 66ef1ae)
  [ -f $T/config.json ] || stage_target
  TRACE_TIMEOUT=300 trace_local --modes ar,tree@16
  trace_remote
  bench_inprocess_checked
  (cd "$OUT" && tar -czf logs.tar.gz trace_engine_*.json drafter.log && rm -f \
    trace_engine_*.json drafter.log)
  mark done
  ;;
87)
  # (after 0-3, carry .carry/g4) send-ahead against each round asking in its step, in
  # the order A B B A (lease 22's c8 rose with run order after a cold start), then the
  # drafter's ContextGraphs on (A) and off (B) in the order A B (both with send-ahead);
  # tree@16 c8 / c1, 160 requests each, through `ddtree serve` (three processes)
  [ -f $T/config.json ] || stage_target
  serve_ahead 1 "tree:16:8 tree:16:1" 0
  serve_ahead 0 "tree:16:8 tree:16:1" 0
  mv "$OUT/report_ahead0_ctx0_tree_c8.json" "$OUT/report_ahead0_ctx0_tree_c8_first.json"
  mv "$OUT/report_ahead0_ctx0_tree_c1.json" "$OUT/report_ahead0_ctx0_tree_c1_first.json"
  serve_ahead 0 "tree:16:8 tree:16:1" 0
  serve_ahead 1 "tree:16:8 tree:16:1" 1
  pack_all $1
  mark done
  ;;
97)
  # (after 0-3, carry .carry/g4) the shared draft link (the default: the drafter runs the
  # draft half over the verifier's round state, CUDA IPC) against the Draft stream over
  # the Unix socket, through `ddtree serve`: tree@16 and ar at c8 / c1 shared, then tree@16
  # c8 / c1 over the socket stream; then tree@16 and ar in process (160 requests)
  [ -f $T/config.json ] || stage_target
  SHARED=1 serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  SHARED=0 serve_ahead 1 "tree:16:8 tree:16:1" 1
  mark "in process, 160 requests"
  NUM=160 BENCH_TIMEOUT=200 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-200
  pack_all $1
  mark done
  ;;
98)
  # (warm after 97) the other order: the socket stream, then shared; tree@16 c8 / c1
  [ -f $T/config.json ] || stage_target
  SHARED=0 RUN=b serve_ahead 1 "tree:16:8 tree:16:1" 1
  SHARED=1 RUN=b serve_ahead 1 "tree:16:8 tree:16:1" 1
  pack_all $1
  mark done
  ;;
101)
  # (after 0-3, carry .carry/g4) the shared link as committed last (its deadline follows
  # the measured answers, it attaches again in the background): tree@16 c8 / c1 and ar c8
  # (the exactness check's reference) through `ddtree serve`
  [ -f $T/config.json ] || stage_target
  SHARED=1 RUN=final serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8" 1
  pack_all $1
  mark done
  ;;
102)
  # (ran with a DDTREE_SHARED_HOST_WAIT knob, removed after: no gain; 2026-12-04)
  # (after 0-3, carry .carry/g4) the hop bench's four ways to wait (device or host, each
  # side), then the shared link through `ddtree serve` with DDTREE_SHARED_HOST_WAIT
  # none / drafter / both / verifier / none: tree@16 c8 / c1 (ar c8 first: the reference)
  [ -f $T/config.json ] || stage_target
  mark "ipc hop bench"
  timeout 120 python3 scripts/gpu/ipc_hop_bench.py --iters 1500 2>&1 | tee "$OUT/ipc_hop_modes.txt"
  DDTREE_SHARED_HOST_WAIT=none SHARED=1 RUN=hwnone serve_ahead 1 "ar:1:8 tree:16:8 tree:16:1" 1
  for wait in drafter both verifier; do
    DDTREE_SHARED_HOST_WAIT=$wait SHARED=1 RUN=hw$wait serve_ahead 1 "tree:16:8 tree:16:1" 1
  done
  DDTREE_SHARED_HOST_WAIT=none SHARED=1 RUN=hwnone2 serve_ahead 1 "tree:16:8 tree:16:1" 1
  pack_all $1
  mark done
  ;;
103)
  # (after 0-3, carry .carry/g4) the verifier and the drafter service traced at once under
  # `ddtree serve` (ddtree/round_trace.py: 200 rounds each, after 300 of the load at c8 and
  # 1000 at c1), tree@16 c8, then c1 (a server each); then the engine in process at c8 (rounds 600-800);
  # scripts/trace_merge.py on each: where the GPU's time goes, both processes' work lined up
  [ -f $T/config.json ] || stage_target
  for c in 8 1; do
    dir=/tmp/trace_c$c; rm -rf $dir; mkdir -p $dir
    DDTREE_TRACE_DIR=$dir DDTREE_TRACE_ROUNDS=$(( c == 8 ? 300 : 1000 )):200 \
      SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" start_serve _trace_c$c || exit 3
    touch $dir/go
    mark "tree@16 c$c traced"
    bench_url tree 16 $c "$OUT/report_trace_c$c.json"
    for _ in $(seq 1 60); do [ "$(ls $dir/*.json 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 1; done
    sleep 2; kill $S; wait $S 2>/dev/null
    python3 scripts/trace_merge.py $dir/engine-*.json $dir/drafter-*.json --gaps 12 \
      | tee "$OUT/merge_c$c.txt"
    python3 scripts/trace_summary.py $dir/engine-*.json --step-name ddtree.round --steps 0 \
      --kernels 12 2>&1 | tail -14 > "$OUT/kernels_engine_c$c.txt"
    python3 scripts/trace_summary.py $dir/drafter-*.json --step-name ddtree.round --steps 0 \
      --kernels 8 2>&1 | tail -10 > "$OUT/kernels_drafter_c$c.txt"
    (cd $dir && tar -czf "$OUT/traces_c$c.tar.gz" ./*.json)
    gzip -f "$OUT/serve_trace_c$c.log"
  done
  dir=/tmp/trace_local; rm -rf $dir; mkdir -p $dir; touch $dir/go
  mark "in process, tree@16 c8 traced"
  DDTREE_TRACE_DIR=$dir DDTREE_TRACE_ROUNDS=600:200 timeout 200 python3 -m ddtree.cli bench \
    --target $T --drafter $D --prompts humaneval --num-prompts 160 --num-requests 160 \
    --modes tree --budgets 16 --concurrency 8 --max-tokens 256 --no-progress 2>&1 | grep humaneval
  python3 scripts/trace_merge.py $dir/engine-*.json | tee "$OUT/merge_local_c8.txt"
  (cd $dir && tar -czf "$OUT/traces_local_c8.tar.gz" ./*.json)
  mark done
  ;;
104)
  # (after 0-3, carry .carry/g4) call 103 again with the windows lined up (the engine
  # starts its window after 300 steps and creates go; the drafter's starts at its next
  # round) and the profiler set up before the traffic: tree@16 c8 through `ddtree serve`,
  # then the engine in process at c8; kernels a round of each trace
  [ -f $T/config.json ] || stage_target
  dir=/tmp/trace_s8; rm -rf $dir; mkdir -p $dir
  DDTREE_TRACE_DIR=$dir DDTREE_TRACE_ROUNDS=300:200 \
    SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" start_serve _trace_s8 || exit 3
  mark "tree@16 c8 traced"
  timeout 150 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts 160 --num-requests 160 --max-tokens 256 --no-progress --client-processes 2 \
    --modes tree --budgets 16 --concurrency 8 2>&1 | grep humaneval
  for _ in $(seq 1 60); do [ "$(ls $dir/*.json 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 1; done
  sleep 2; kill $S; wait $S 2>/dev/null
  grep -c shared_draft_lost "$OUT/serve_trace_s8.log"
  python3 scripts/trace_merge.py $dir/engine-*.json $dir/drafter-*.json --gaps 12
  python3 scripts/trace_kernels.py $dir/engine-*.json 25 > "$OUT/kernels_served_engine.txt"
  python3 scripts/trace_kernels.py $dir/drafter-*.json 25 > "$OUT/kernels_served_drafter.txt"
  dir2=/tmp/trace_l8; rm -rf $dir2; mkdir -p $dir2
  mark "in process, tree@16 c8 traced"
  DDTREE_TRACE_DIR=$dir2 DDTREE_TRACE_ROUNDS=600:200 timeout 200 python3 -m ddtree.cli bench \
    --target $T --drafter $D --prompts humaneval --num-prompts 160 --num-requests 160 \
    --modes tree --budgets 16 --concurrency 8 --max-tokens 256 --no-progress 2>&1 | grep humaneval
  python3 scripts/trace_merge.py $dir2/engine-*.json
  python3 scripts/trace_kernels.py $dir2/engine-*.json 40 > "$OUT/kernels_local.txt"
  tar -czf "$OUT/traces104.tar.gz" $dir/*.json $dir2/*.json
  gzip -f "$OUT/serve_trace_s8.log"
  mark done
  ;;
105)
  # (after 0-3, carry .carry/g4) tree attention's splits taken in turn by at most
  # SPLIT_PROGRAMS programs (the served model length no longer fills the grid with idle
  # programs): tree@16 c8 / c1 and ar c8 (the exactness check's reference) through
  # `ddtree serve`, as call 101, with ar c1; then ar / tree@16 in process over the same 160
  # requests (the gateway's ratio to in process, in one run)
  [ -f $T/config.json ] || stage_target
  SHARED=1 RUN=splits serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  mark "ar / tree@16 in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-300
  pack_all $1
  mark done
  ;;
106)
  # (warm after 105) call 105's tree@16 c8 / c1 and ar c8 / c1 through `ddtree serve` again
  SHARED=1 RUN=splits2 serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  pack_all $1
  mark done
  ;;
107)
  # (after 0-3, carry .carry/g4) issue 8's batch-1 table with the split change: ar /
  # linear / tree@16 / tree@32 / shadow@16 beside transformers' static-cache generate, then
  # the Qwen3-8B shapes (random bf16 weights built here)
  [ -f $T/config.json ] || stage_target
  mark "engine_bench speed"
  timeout 200 python3 scripts/gpu/engine_bench.py --stages speed \
    --speed-modes ar,linear,tree@16,tree@32,shadow@16 --speed-variants plain --target $T \
    --humaneval $H 2>&1 | grep -E "tok/s|Error|error" | grep -v Warn | tail -12
  mark "shapes8b"
  timeout 240 python3 scripts/gpu/engine_bench.py --stages shapes8b --target $T \
    --humaneval $H 2>&1 | grep -v Warn | grep -E "^8B|Error"
  pack_all $1
  mark done
  ;;
108)
  # (after 0-3, carry .carry/g4) issue 7's exactness in float32 through `ddtree serve`:
  # tree@16 c8 / c1 and ar c8 against ar c1 (single-request runs), 24 requests x 128
  # tokens each (the first try, 160 x 256, passed 150 s at ar c1: ~27 ms a c8 tree round
  # in float32)
  [ -f $T/config.json ] || stage_target
  NUM=24 MAXTOK=128 SERVE_EXTRA="--dtype float32" SHARED=1 RUN=fp32 serve_ahead 1 \
    "ar:1:1 tree:16:8 ar:1:8 tree:16:1" 1
  pack_all $1
  mark done
  ;;
111)
  # (after 0-3, carry .carry/g4) the norm after o_proj / down in the projection's split-K
  # reduce (EngineConfig.reduce_fusions, on): the pieces alone (scripts/gpu/norm_bench.py),
  # the batch-1 table with and without it beside transformers (every row against the
  # plain ar tokens), then every mode against ar at c1 and c8 with it (exact stage)
  [ -f $T/config.json ] || stage_target
  mark "norm_bench"
  timeout 120 python3 scripts/gpu/norm_bench.py 2>&1 | grep -v Warn | tail -14
  cp /tmp/norm_bench.json "$OUT/" 2>/dev/null
  mark "engine_bench speed plain, no reduce fusions"
  speed_table "plain,no reduce fusions"
  mark "exact"
  exact_modes
  pack_all $1
  mark done
  ;;
112)
  # (warm after 111) the Qwen3-8B shapes with the norms in the reduces and without, twice
  # in turn; then the demo's o_proj split 3 ways (its norm then rides on the reduce too):
  # the batch-1 table with that tiling table
  shapes8b_runs reduce-fusions no-reduce-fusions reduce-fusions no-reduce-fusions
  python3 - <<'PY'
import json
table = json.load(open("ddtree/kernels/linear_tuned.json"))
table["576x576:bfloat16"] = dict(table["576x576:bfloat16"], split_k=3)
json.dump(table, open("/tmp/table_o3.json", "w"))
PY
  mark "engine_bench speed, o_proj split 3"
  speed_table plain --linear-table /tmp/table_o3.json --no-hf
  mv "$OUT/engine_speed.json" "$OUT/engine_speed_o3.json"
  pack_all $1
  mark done
  ;;
113)
  # (after 0-3, carry .carry/g4) the reduce fusions (EngineConfig.reduce_fusions, on):
  # call 111's norms after o_proj / down in their reduces, and now RoPE + the KV store
  # from the QKV GEMM's split partials (the 8B QKV splits K; the demo's does not): the
  # batch-1 table with and without them beside transformers, every mode against ar at c1
  # and c8, the 8B shapes with and without, twice in turn
  [ -f $T/config.json ] || stage_target
  mark "engine_bench speed plain, no reduce fusions"
  speed_table "plain,no reduce fusions"
  mark "exact"
  exact_modes
  shapes8b_runs reduce-fusions no-reduce-fusions reduce-fusions no-reduce-fusions
  pack_all $1
  mark done
  ;;
114)
  # (after call 0 alone: no target needed) the Qwen3-8B shapes with the reduce fusions,
  # four more runs on a fresh machine (call 113 put the ar step at the 1.2x line)
  shapes8b_runs - - - -
  pack_all $1
  mark done
  ;;
124)
  # (after 0-3, carry .carry/g4) round_commit with the split argmax (the walk's and ar's)
  # and the drafter's fc + norm through the invariant GEMM and the norm kernel
  # (DFlashDrafter.fuse_infer): the kernels' GPU tests, the fc shapes tuned, the batch-1
  # table plain / without round_commit / without tree attention's query groups (every
  # row's tokens against plain ar's); every mode against ar is call 127's
  [ -f $T/config.json ] || stage_target
  mark "round_commit tests on the GPU"
  DDTREE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_round_commit.py 2>&1 | tail -3
  # the drafters' fc GEMMs (new to the invariant GEMM): tuned into the table the rest of
  # this call and the next use (the machine's copy), against torch's cuBLAS; the table
  # comes back for a commit
  mark "tune the fc shapes"
  timeout 120 python3 scripts/gpu/tune_linear.py --shapes drafter.fc,qwen3.drafter_fc \
    --seconds-per-shape 15 2>&1 | grep -v Warn | tail -4
  cp ddtree/kernels/linear_tuned.json "$OUT/"
  cp ddtree/kernels/linear_tuned.json /tmp/linear_tuned.json
  mark "engine_bench speed plain, no round commit, no query groups, separate context"
  speed_table "plain,no round commit,no query groups,separate context"
  pack_all $1
  mark done
  ;;
127)
  # (warm after 124) tree attention's query groups and wide launches (2 stages at head dim
  # 128 past the SM count), the exactness side: every mode against ar at c1 and c8 (the
  # demo: groups on), the wide-launch and group tests on the GPU, the kernel table one
  # query a program against groups at both stage counts (attn_sweep.py --groups: lease
  # 15's sweep had one tree of 64 nodes at 42.4 us, 34.6 at 2 stages; prediction with
  # groups ~12-18), the twin checks across stage counts (tree queries at one, ar twins
  # at the other)
  [ -f $T/config.json ] || stage_target
  [ -f /tmp/linear_tuned.json ] && cp /tmp/linear_tuned.json ddtree/kernels/linear_tuned.json
  mark "exact"
  exact_modes
  mark "wide launch and group tests, groups table, twins across stage counts"
  DDTREE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_tree_attention.py -k "wide_launch_equals or query_groups" 2>&1 | tail -3
  timeout 150 python3 scripts/gpu/attn_sweep.py --groups --json-out "$OUT/attn_groups.json" \
    2>&1 | grep -v Warn | grep -v '^{' | tail -14
  timeout 120 python3 scripts/gpu/attn_sweep.py --twins 64/4/2:64/4/3 64/4/3:64/4/2 \
    64/2/3:64/2/2 2>&1 | grep -v Warn | tail -8
  pack_all $1
  mark done
  ;;
128)
  # (warm after 127, or after 0 alone: random 8B weights, no target needed) the 8B shapes
  # with query groups and wide launches, with neither, groups alone, both again
  # (prediction: verify of 1 + 63 nodes 6.24 -> ~5.2-5.5 ms with both, ~5.96 with wide
  # launches alone; the ar step unchanged; the drafter block (16 queries on one context:
  # grouped) a little faster; every run's tokens equal ar's), call 124's fc tilings
  [ -f /tmp/linear_tuned.json ] && cp /tmp/linear_tuned.json ddtree/kernels/linear_tuned.json
  i=0
  for flags in "" "--no-wide-stages --no-query-groups" "--no-wide-stages" \
      "--no-context-in-block" ""; do
    i=$((i + 1)); mark "shapes8b $flags"
    timeout 110 python3 scripts/gpu/engine_bench.py --stages shapes8b $flags --target $T \
      --humaneval $H 2>&1 | grep -v Warn | grep -E "^8B|Error"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_$i.json"
  done
  # where the drafter block goes (0.29x an ar step, target 0.25x; linear's draft alone
  # 0.26x): the draft graphs replayed alone, kernel by kernel (profile8b_kernels.txt)
  mark "profile8b: the draft graphs alone"
  timeout 150 python3 scripts/gpu/engine_bench.py --stages profile8b --target $T \
    --humaneval $H 2>&1 | grep -v Warn | grep -E "^== 8B draft|_kernel|nvjet|Self CUDA|Error" \
    | head -60
  pack_all $1
  mark done
  ;;
129)
  # (any machine, nothing staged: the bench needs torch and triton only) the hop between
  # two processes' GPU work, waiting on IPC events (gpu/gpu, the shared link's way), by
  # spinning kernels on a flag in shared device memory (spin), by the driver's stream
  # memory operations on the same flags (memop) and on flags in pinned shared host memory
  # (hostmemop: a dead peer's flag is still there to write), first time-sliced (two
  # contexts), then as clients of one MPS server (a user-space daemon, quit at the end;
  # the compute mode untouched). Lease 30: events cost 277 us a hop pair time-sliced,
  # 9 us under MPS with kernels of 50 us and more but ~1.9 ms an iteration with tiny
  # kernels (the waits resolved late); a spinning kernel sees the flag itself
  mark "hop bench, time-sliced"
  timeout 150 python3 scripts/gpu/ipc_hop_bench.py --iters 400 --modes gpu/gpu,spin,memop,hostmemop 2>&1 \
    | grep -v Warn | tee "$OUT/ipc_hop_spin.txt"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && mark "MPS daemon started"
  timeout 150 python3 scripts/gpu/ipc_hop_bench.py --iters 1500 --modes gpu/gpu,spin,memop,hostmemop 2>&1 \
    | grep -v Warn | tee "$OUT/ipc_hop_spin_mps.txt"
  echo quit | nvidia-cuda-mps-control; sleep 1
  # the drafter's vocabulary top-K in other tournament shapes (leaf chunk / leaf warps /
  # merge warps; 512/1/1 is the kernel's): at 8B its merges took ~77 us of a tree@63
  # draft (lease 15's profile: two levels of one-warp programs, ~160 and 16 of them)
  mark "tree build: the beams now against the former widths"
  timeout 120 python3 scripts/gpu/tree_build_bench.py --warps 4 --wide-beams 2>&1 \
    | grep -v Warn | tee "$OUT/tree_build_beams.txt" | tail -8
  mark "vocab top-K shapes"
  timeout 200 python3 -m tests.kernels.bench_vocab_topk --shapes \
    512/1/1,512/1/2,512/1/4,512/1/8,256/1/4,1024/2/4,2048/4/4,2048/4/8 2>&1 \
    | grep -v Warn | tee "$OUT/vocab_topk_shapes.txt" | tail -50
  pack_all $1
  mark done
  ;;
126)
  # (warm after 124 or 125) tree@16 c8 / c1 through `ddtree serve` and in process (160
  # requests), with call 124's tuned fc tilings (each call gets a fresh copy of the
  # repository: the table is put back from /tmp); the 8B shapes moved to call 128
  [ -f $T/config.json ] || stage_target
  [ -f /tmp/linear_tuned.json ] && cp /tmp/linear_tuned.json ddtree/kernels/linear_tuned.json
  SHARED=1 RUN=argmax serve_ahead 1 "tree:16:8 tree:16:1" 1
  mark "tree@16 in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess tree 16 "$OUT/report_inprocess.json"
  pack_all $1
  mark done
  ;;
136)
  # (after 0-3, carry .carry/g4) the concurrency curves as a user measures them (`ddtree
  # bench` in process, closed loop: a finished request's worker sends the next at once):
  # ar and auto at c1, c8, c32, c64, HumanEval x 256 tokens, 4 s of requests a point after
  # one warm-up request per worker; one engine for the whole grid (a server's life). Each
  # sample compared with ar's
  [ -f $T/config.json ] || stage_target
  closed_loop_curves
  pack_all $1
  mark done
  ;;
140)
  # (after 0-3 with py-spy among the wheels, carry .carry/g4) where the gateway's time goes
  # at one token an event: ar c8 through `ddtree serve` (lease 39: the gateway ended ar c8
  # requests 40 ms after the verifier's last round, 2 ms with tree@16), 160 requests, two
  # client processes, py-spy on the gateway and the verifier (250 Hz, idle threads too),
  # their summaries; then tree@16 c8 the same way for the comparison
  [ -f $T/config.json ] || stage_target
  mark "serve (services, --max-budget 16 --max-num-seqs 8)"
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" start_serve _prof || exit 3
  for mode in ar tree; do
    mark "$mode c8, 160 requests, py-spy on the gateway and the verifier"
    spy_start 250 "$mode" gateway verifier
    bench_url $mode 16 8 "$OUT/report_${mode}_c8.json"
    spy_summaries "$mode" gateway verifier
  done
  kill $S; wait $S 2>/dev/null
  (cd "$OUT" && gzip -f spy_ar_gateway.txt spy_ar_verifier.txt spy_tree_gateway.txt \
    spy_tree_verifier.txt; gzip -f serve_prof.log)
  pack_all $1
  mark done
  ;;
146)
  # (after 0-3, carry .carry/g4) the services' GIL switch interval at GILS (0.5 / 0.2 /
  # 0.1 ms; lease 41: 5 -> 0.5 ms took the shared stream's read lag from 10-13 to ~2 ms,
  # about four waits of one interval on a message's way, and lease 42's call 145 left
  # the gateway's TTFT window at 7.3 ms against 2.8 in process): `ddtree serve` restarted
  # at each, ar c8 and tree@16 c8 through it; then the same 160 requests in process
  [ -f $T/config.json ] || stage_target
  for gil in ${GILS:-0.0005 0.0002 0.0001}; do
    mark "serve at GIL switch interval $gil s"
    DDTREE_GIL_SWITCH_INTERVAL_S=$gil \
      SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" \
      start_serve _gil$gil || exit 3
    bench_url_timed ar 1 8 "$OUT/report_ar_c8_gil$gil.json"
    bench_url_timed tree 16 8 "$OUT/report_tree_c8_gil$gil.json"
    kill $S; wait $S 2>/dev/null
  done
  mark "ar / tree@16 in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  gzip -f "$OUT"/serve_gil*.log  # the reports: pack_all
  pack_all $1
  mark done
  ;;
145)
  # (after 0-3, carry .carry/g4) call 143 at this session's gateway (the first token's
  # path without two task hops, the inter-token histogram in one increment per bucket;
  # the services' GIL switch interval 0.5 ms by default), ar c8 also from 4 client
  # processes and from 1 (is the client's share of TTFT its own loop?)
  SERVE_RUNS="ar:1:8 tree:16:8 auto:16:8 ar:1:8:4 ar:1:8:1 tree:16:1" exec bash "$0" 143
  ;;
147)
  # (after 0-3, g3b-g3e, carry .carry/g4) the first token's way stage by stage (the
  # gateway's new request_prepare / verifier_start / verifier_first_token timings beside
  # TTFT and the read lag), each service's CPU per thread (threads.txt, named by py-spy
  # dumps), the bench client on aiohttp, a generation's start written without waiting for
  # gRPC's confirmation: ar / tree@16 / auto c8 twice, tree@16 c1, then in process
  SERVE_RUNS="ar:1:8 tree:16:8 auto:16:8 ar:1:8 tree:16:8 tree:16:1" exec bash "$0" 143
  ;;
148)
  # (after 0-3, g3b-g3e, carry .carry/g4) two gateway processes against one (call 147: the
  # one gateway's event loop was ~88% busy over ar c8, 72% over tree@16 c8: its first tokens
  # queue behind other streams' events): `ddtree serve --gateway-workers 2`, ar / tree@16 /
  # auto c8 twice; then one worker, the same; then in process
  [ -f $T/config.json ] || stage_target
  for workers in 2 1; do
    mark "serve with $workers gateway processes"
    GATEWAY_WORKERS=$workers SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" \
      setting_runs w$workers ar:1:8 tree:16:8 auto:16:8 ar:1:8 tree:16:8 || exit 3
  done
  mark "ar / tree@16 / auto in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess ar,tree,auto 16 "$OUT/report_inprocess.json"
  pack_all $1
  mark done
  ;;
152)
  # (after 0-3, g3b-g3e, carry .carry/g4; warm after 125 too) what MPS costs the
  # engine itself (call 151: through serve ar c8 0.966x of in process without MPS, 0.93x
  # as its client; tree@16 0.85x without, 0.965x with): ar / tree@16 c8 in process
  # (160 requests) without and as a client of a private MPS server, alternated twice
  [ -f $T/config.json ] || stage_target
  mark "a graph's replay + copy + event wait, without MPS, then as an MPS client"
  python3 scripts/gpu/sync_latency.py
  python3 scripts/gpu/under_mps.py -- python3 scripts/gpu/sync_latency.py
  for round in 1 2; do
    for mps in off on; do
      mark "in process, MPS $mps ($round)"
      wrap=env; [ $mps = on ] && wrap="python3 scripts/gpu/under_mps.py --"
      $wrap timeout 150 python3 -m ddtree.cli bench --target $T --drafter $D \
        --prompts humaneval --num-prompts 160 --num-requests 160 --modes ar,tree --budgets 16 \
        --concurrency 8 --max-tokens 256 --no-progress \
        --json-out "$OUT/report_mps${mps}_$round.json" 2>&1 | grep -E "humaneval|MPS|rror"
    done
  done
  pack_all $1
  mark done
  ;;
r171)
  # (after 0-3, g3b-g3e, carry .carry/g4) why `auto` drafted at c8 in lease 57 (0.915x ar
  # in process after 32 requests as ar): the policy under a closed loop of 8 answers of
  # their own length on an 8-row engine, warmed up (what `ddtree bench --concurrency 8`
  # sends), each turn between ar and drafting printed with the policy's beliefs; then the
  # same with every answer 256 tokens (the closed loop of earlier leases). ~2 min
  [ -f $T/config.json ] || stage_target
  for eos in --stop-at-eos ""; do
    mark "policy probe c8 ${eos:-(256 tokens)}"
    timeout 200 python3 scripts/gpu/policy_probe.py $T $D $H --concurrency 8 --seconds 4 \
      --max-num-seqs 8 --warm-up --watch $eos 2>&1 | grep -v Warn | tail -24
    mv "$OUT/policy_probe.json" "$OUT/policy_probe${eos:+_eos}.json"
  done
  pack_all $1
  mark done
  ;;
r170)
  # (after 0-3, g3b-g3e, carry .carry/g4) more samples of call 165's gateway rows (lease
  # 53: ar c8 through serve 0.963x / 0.964x in process, auto 0.960x / 0.932x): through
  # serve auto / ar / auto / ar / auto / ar, then in process auto / ar (~3 min)
  gateway_c8 "auto:16:8 ar:1:8 auto:16:8 ar:1:8 auto:16:8 ar:1:8" "auto ar" $1
  ;;
165)
  # (after 0-3, g3b-g3e, carry .carry/g4) the gateway's c8 rows of issue 8 on the demo
  # target, ar and auto (which serves ar at c8): through serve ar / auto / ar / auto, then
  # in process in the same order (~4 min; call 125 after it: the load curves)
  gateway_c8 "ar:1:8 auto:16:8 ar:1:8 auto:16:8" "ar auto ar auto" $1
  ;;
164)
  # (after 0-3, g3b-g3e, carry .carry/g4; fortieth session) the demo target after the
  # prefix prefetch fix (51f78dd): ar c8 through serve as MPS clients (the default) twice,
  # then in process (no MPS) twice; the stage summary last (~3 min)
  [ -f $T/config.json ] || stage_target
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" setting_runs mps ar:1:8 ar:1:8 \
    || exit 3
  ar8 off
  ar8 off
  summary_and_pack $1
  ;;
156)
  # (after 0-3, g3b-g3e, carry .carry/g4) mps_apart on the demo target, then call 155 (the
  # drafter in the verifier's process, no MPS, through serve)
  [ -f $T/config.json ] || stage_target
  mps_apart
  exec bash "$0" 155
  ;;
r156)
  # (carry .whl and .carry/rand alone: no staging) mps_apart on a random-weight target of
  # the demo's shapes (scripts/gpu/random_target.py: its ar steps cost what the demo's
  # do; no EOS, so every request runs its 256 tokens)
  T=$R
  [ -f $T/model.safetensors ] || python3 scripts/gpu/random_target.py .carry/rand $T
  mps_apart
  pack_all $1
  mark done
  ;;
r157)
  # (warm after r156, carry .carry/rand) ar c8 through `ddtree serve` on the random
  # target: as MPS clients (the default), without MPS, the drafter in the verifier's
  # process (no MPS), no drafter at all (`--mode ar`) as the only MPS client (solo_mps)
  # and without MPS (solo); each twice, then ar c8 in process. R157_SETTINGS cuts the list.
  T=$R
  [ -f $T/model.safetensors ] || python3 scripts/gpu/random_target.py .carry/rand $T
  for setting in ${R157_SETTINGS:-mps off colocated solo_mps solo}; do
    mark "serve: $setting"
    case $setting in
      mps) mps=auto extra="" ;;
      off) mps=off extra="" ;;
      colocated) mps=off extra=--colocate-drafter ;;
      solo_mps) mps=on extra="--mode ar" ;;
      solo) mps=off extra="--mode ar" ;;
      mps_base) mps=auto extra="" ;;  # call r159: the gateway package of .basegw
      off_base) mps=off extra="" ;;
      mps_short) mps=auto extra="--max-model-len 1024" ;;  # call r161: rows sized as in process
      off_short) mps=off extra="--max-model-len 1024" ;;
    esac
    # *_base: .basegw's gateway package in place of this one while that serve runs (the
    # working directory comes first on a `python -m` path: PYTHONPATH cannot put it first)
    case $setting in *_base) mv gateway .gateway_now && cp -r .basegw/gateway gateway ;; esac
    python3 -c 'import gateway.responses as r
print("gateway:", "this checkout" if hasattr(r.Formatter, "chunk_event") else "earlier")'
    DDTREE_MPS=$mps \
      SERVE_ARGS="$extra --budget 16 --max-budget 16 --max-num-seqs 8" \
      setting_runs $setting ar:1:8 ar:1:8
    rc=$?
    case $setting in *_base) rm -rf gateway && mv .gateway_now gateway ;; esac
    [ $rc = 0 ] || exit 3
  done
  [ "${R157_INPROCESS:-1}" = 1 ] && ar8 off  # R157_INPROCESS=0: serve alone (a small budget)
  [ "${R157_PACK:-1}" = 1 ] && pack_all $1  # R157_PACK=0: the caller packs (call r161)
  mark done
  ;;
r158)
  # (carry .whl and .carry/rand: no staging) r156 and r157 cut to fit one call (~8 min
  # with the setup: ~25 s a serve start, ~12 s a run), so that one machine start answers
  # both when starts keep failing: in process off / mps / mps_idle / mps / off, then
  # through serve mps / solo_mps / off / colocated (twice each) and in process
  MPS_RUNS="${MPS_RUNS:-off mps mps_idle mps off}" bash "$0" r156 || exit 3
  R157_SETTINGS="${R157_SETTINGS:-mps solo_mps off colocated}" exec bash "$0" r157
  ;;
r159)
  # (carry .whl and .carry/rand: no staging; thirty-ninth session) the gateway's event
  # loop near a full core at ar c8 (lease 45: 4.3 s of CPU over a 4.4 s run): ar c8
  # through serve with this checkout's gateway against an earlier one's (its `gateway`
  # package copied to .basegw/, untracked: `git archive <commit> gateway | tar x -C
  # .basegw`), as MPS clients and without MPS, alternated; then in process
  [ -d .basegw/gateway ] || { echo "no .basegw/gateway"; exit 3; }
  R157_SETTINGS="${R157_SETTINGS:-mps mps_base off off_base}" exec bash "$0" r157
  ;;
r166)
  # (carry .whl only: random 8B weights built here, no staging; any machine, an H200 where
  # one comes) the 8B shapes twice: shapes8b reports step_ms, a round's device time in
  # steady state (engine_bench.RoundEnds), beside round_ms (decode wall / (rounds - 1),
  # every lease's figure before the forty-first session: it also counts the pipeline's
  # fill and the dropped round after the last token); then the ar steps traced, each
  # kernel charged its share of the critical path (scripts/trace_kernels.py). ~2 min.
  # Leases 52-54 (forty-first session) ran variants of it at ee83194: the prefetch budget
  # (--prefetch-mb 16 / 32), each kernel letting the next launch before its own wait
  # (DDTREE_PDL_EARLY=1; also on the demo's batch-1 rows, call r168) and the split-K
  # reduce's norm in a static loop (call r167, at c35f625); all slower, removed. Lease 56
  # (call r169, at 8503825) read the reduce's row back through a pipelined loop: no change.
  shapes8b_runs - -
  mark "profile8b ar"
  timeout 150 python3 scripts/gpu/engine_bench.py --stages profile8b --profile8b-modes ar \
    --target $T --humaneval $H 2>&1 | grep -E "Error" | head -5
  mv "$OUT/trace8b_ar.json" "$OUT/trace_8b_ar.json"
  python3 scripts/trace_kernels.py "$OUT/trace_8b_ar.json" 32 > "$OUT/kernels_8b_ar.txt"
  grep -A32 "critical path" "$OUT/kernels_8b_ar.txt"
  pack_all $1
  mark done
  ;;
r161)
  # (carry .whl and .carry/rand: no staging) the device time of ar's c8 rounds in
  # process and through serve, with and without MPS: bench samples carry the server's
  # stage times since the thirty-ninth session (scripts/gpu/stage_summary.py: verify ms a
  # round). Lease 46 put serve's rounds at 0.781 ms as MPS clients and 0.750 without, while
  # MPS cost 0.7% of ar's throughput in process. In process off / mps, then serve mps /
  # off / mps_short (--max-model-len 1024: rows nearer the bench's ~700 tokens; the
  # attention's split grid is sized from the row length: 33 splits a query at 8,192, 5 at
  # 1,024), then in process mps / off again; the summary table last (~7 min). Lease 48
  # ran it at 8d88337 with a context bucket of 2,048 as well (mps_ctx; removed since:
  # the fix was the prefetch's sharing, 51f78dd). Calls r162 and r163 (leases 49, 50: ar
  # c8 in process at rows of 8,192 by KV storage order, context bucket and prefetch
  # sharing; scripts/gpu/bench_engine_config.py) ran at 8fe6815 and 51f78dd: check
  # out that commit to run them again.
  T=$R
  [ -f $T/model.safetensors ] || python3 scripts/gpu/random_target.py .carry/rand $T
  ar8 off
  ar8 mps
  R157_SETTINGS="${R157_SETTINGS:-mps off mps_short}" R157_INPROCESS=0 R157_PACK=0 \
    bash "$0" r157 || exit 3
  ar8 mps
  ar8 off
  summary_and_pack $1
  ;;
155)
  # (after 0-3, g3b-g3e, carry .carry/g4) call 154 cut to fit a small budget: serve with
  # the drafter in the verifier's process (no MPS), ar / tree@16 c8 once, then in process c8
  [ -f $T/config.json ] || stage_target
  SERVE_ARGS="--colocate-drafter --budget 16 --max-budget 16 --max-num-seqs 8" \
    setting_runs colocated ar:1:8 tree:16:8 || exit 3
  mark "ar / tree@16 c8 in process, 160 requests"
  timeout 120 python3 -m ddtree.cli bench --target $T --drafter $D --prompts humaneval \
    --num-prompts 160 --num-requests 160 --modes ar,tree --budgets 16 --concurrency 8 \
    --max-tokens 256 --no-progress --json-out "$OUT/report_inprocess.json" 2>&1 | grep humaneval
  pack_all $1
  mark done
  ;;
154)
  # (after 0-3, g3b-g3e, carry .carry/g4) the drafter in the verifier's process
  # (`ddtree serve --colocate-drafter`: one GPU context, no MPS; call 151: as MPS clients
  # ar c8 0.93x of in process, tree@16 0.965x; without MPS ar 0.967x, tree@16 0.847x):
  # ar / tree@16 c8 twice each through it; before it the default serve (socket, MPS) at
  # c1 (the batch-1 target, 0.8x: 0.922x for tree@16 over gRPC, lease 43); then in process
  [ -f $T/config.json ] || stage_target
  mark "serve (the default three processes), c1"
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" \
    setting_runs default tree:16:1 ar:1:1 || exit 3
  mark "serve --colocate-drafter"
  SERVE_ARGS="--colocate-drafter --budget 16 --max-budget 16 --max-num-seqs 8" \
    setting_runs colocated ar:1:8 tree:16:8 ar:1:8 tree:16:8 || exit 3
  mark "ar / tree@16 in process, 160 requests"
  BENCH_TIMEOUT=200 NUM=160 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  pack_all $1
  mark done
  ;;
153)
  # (warm) call 125 after a server's warm-up (Engine.warm_up: every shape captured first;
  # call 125 on an H100: auto's second warm run at c8 re-explored and captured a graph
  # inside its ~0.3 s, 0.82x ar)
  LOAD_ARGS=--warm-up exec bash "$0" 125
  ;;
151)
  # (warm after 150) ar's remaining gap through serve with the socket (call 150: 0.93x of
  # in process at c8, TTFT +2-3 ms, per token +3%): the verifier and the drafter as
  # clients of MPS (serve's default on one GPU) against without (DDTREE_MPS=off), ar c8
  # twice and tree@16 c8 once each, then ar / tree@16 in process
  [ -f $T/config.json ] || stage_target
  for mps in off auto; do
    mark "serve, DDTREE_MPS=$mps"
    DDTREE_MPS=$mps SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" \
      setting_runs mps$mps ar:1:8 tree:16:8 ar:1:8 || exit 3
  done
  mark "ar / tree@16 in process, 160 requests"
  BENCH_TIMEOUT=200 NUM=160 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  pack_all $1
  mark done
  ;;
150)
  # (after 0-3, g3b-g3e, carry .carry/g4) the gateway's shared stream over the
  # verifier's Unix socket (default now) against gRPC (DDTREE_VERIFIER_SOCKET=0: lease 43,
  # Python gRPC's ~100-150 us of CPU a message on each side, ar c8 through serve 0.84-0.92x
  # of in process), and the socket with --send-at-wait (in place of call 149, whose lease
  # was cut off): serve per setting, ar / tree@16 c8 twice each, then in process
  [ -f $T/config.json ] || stage_target
  # (its third setting, unixwait with DDTREE_SEND_AT_WAIT=1, ran at 9bfe918: the flag was
  # removed after it measured nothing)
  for setting in unix grpc; do
    mark "serve, shared stream setting $setting"
    DDTREE_VERIFIER_SOCKET=$([ $setting = grpc ] && echo 0 || echo 1) \
      SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8" \
      setting_runs $setting ar:1:8 tree:16:8 ar:1:8 tree:16:8 || exit 3
    zcat "$OUT/serve_$setting.log.gz" | grep -h verifier_stream_open | head -2 | cut -c1-240
  done
  mark "ar / tree@16 in process, 160 requests"
  BENCH_TIMEOUT=200 NUM=160 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  pack_all $1
  mark done
  ;;
144)
  # (warm, after 143) tree@16 / auto / ar at c8 through `ddtree serve` alone, the services'
  # GIL switch interval from the caller's DDTREE_GIL_SWITCH_INTERVAL_S (lease 41: 0.0005)
  SERVE_RUNS="tree:16:8 auto:16:8 ar:1:8" IN_PROCESS=0 exec bash "$0" 143
  ;;
143)
  # (after 0-3, carry .carry/g4) the shared stream read on a thread of its own (call 142:
  # the verifier's messages reached the gateway's loop 26-83 ms after it built them, ar c8
  # through serve 5,649-7,077 tok/s): `ddtree serve` (auto, --max-budget 16), ar / tree@16
  # / auto at c8 and ar again, then tree@16 c1, each with the read / hop / delivery sums
  # after it; then the same 160 requests in process (ar, tree@16, auto at c1 and c8) unless
  # IN_PROCESS=0; SERVE_RUNS (mode:budget:concurrency[:client processes, else CLIENTS or
  # 2] ...) names other serve runs
  [ -f $T/config.json ] || stage_target
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" start_serve _143 || exit 3
  for run in ${SERVE_RUNS:-ar:1:8 tree:16:8 auto:16:8 ar:1:8 tree:16:1}; do
    IFS=: read -r mode budget c clients <<< "$run"
    clients=${clients:-${CLIENTS:-2}}
    mark "$mode@$budget c$c through serve, $clients client processes"
    CLIENTS=$clients bench_url_timed $mode $budget $c \
      "$OUT/report_${mode}_c${c}_k${clients}_$(date +%s).json"
  done
  kill $S; wait $S 2>/dev/null
  if [ "${IN_PROCESS:-1}" = 1 ]; then
    mark "ar / tree@16 / auto in process, 160 requests"
    BENCH_TIMEOUT=240 NUM=160 bench_inprocess ar,tree,auto 16 "$OUT/report_inprocess.json"
    python3 scripts/gpu/ar_mismatches.py "$OUT"/report_*.json | tail -6 | cut -c1-300
  fi
  (cd "$OUT" && gzip -f report_*.json serve_143.log)
  pack_all $1
  mark done
  ;;
142)
  # (after 0-3, carry .carry/g4) whether the bench client holds ar at c8 through `ddtree
  # serve` (lease 40: 0.76x of in process with one or two gateway processes, the gateway
  # at ~50% of a core, requests ending 23-30 ms after the verifier's last message):
  # `ddtree serve --mode ar` (no drafter), ar c8 from 2 client processes, 6, then 2 again;
  # after each run the way from the verifier's messages as /metrics has it (cumulative:
  # verifier -> gateway taking a message up, verifier -> event written to the client)
  # and the CPU each process and the whole machine used during the run (the lease-40 lead
  # on a 2-core sandbox was a starved machine: is the GPU host's busier than it looks?)
  [ -f $T/config.json ] || stage_target
  SERVE_ARGS="--mode ar --max-num-seqs 8 --pid-dir $OUT/pids" start_serve _ar || exit 3
  for clients in 2 6 2; do
    mark "ar c8, $clients client processes"
    CLIENTS=$clients bench_url_timed ar 16 8 "$OUT/report_ar_clients$clients.json"
  done
  kill $S; wait $S 2>/dev/null
  gzip -f "$OUT/serve_ar.log"
  pack_all $1
  mark done
  ;;
141)
  # (after 0-3, carry .carry/g4) where ar at c8 through `ddtree serve` loses (call 140: 6,005
  # tok/s, TTFT p50 65 ms; the gateway ended requests 47 ms after the verifier's last round,
  # 3 ms with tree@16): one gateway process, then two (--gateway-workers 2), ar and auto c8
  # through each (160 requests, two client processes); py-spy (CPU samples only, the whole
  # bench) on the gateway and the verifier in the first ar run; then ar / auto in process
  # over the same 160 requests (c1, c8)
  [ -f $T/config.json ] || stage_target
  for workers in 1 2; do
    mark "serve, $workers gateway process(es)"
    SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" \
      GATEWAY_WORKERS=$workers start_serve _w$workers || exit 3
    for mode in ar auto; do
      mark "$mode c8 through serve, $workers gateway process(es)"
      [ "$workers$mode" = 1ar ] && SPY_DELAY=0 SPY_SECONDS=25 SPY_IDLE=0 spy_start 200 ar_w1 \
        gateway verifier
      bench_url $mode 16 8 "$OUT/report_${mode}_w$workers.json"
      [ "$workers$mode" = 1ar ] && spy_summaries ar_w1 gateway verifier
    done
    kill $S; wait $S 2>/dev/null
  done
  mark "ar / auto in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess ar,auto 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT"/report_*.json | tail -2 | cut -c1-300
  (cd "$OUT" && gzip -f spy_ar_w1_*.txt report_*.json serve_w*.log)
  pack_all $1
  mark done
  ;;
139)
  # (after 0-3, carry .carry/g4) the policy with ROUND_SAMPLES and STALE_TAU_FACTOR (lease
  # 39 served auto at 0.62-0.88x ar at 32 rows under a closed loop): the policy probe
  # (closed loop in process, ar and auto alternated at c8 / c32 / c64, the snapshot), then
  # call 136's curves under continuous load (`ddtree bench`, ar and auto c1-c64)
  [ -f $T/config.json ] || stage_target
  mark "policy probe"
  timeout 200 python3 scripts/gpu/policy_probe.py $T $D $H 2>&1 | grep -v Warn \
    | tee "$OUT/policy_probe.txt" | tail -22
  closed_loop_curves
  rm -f "$OUT/report_curves.json"*  # 1.8 MB of samples: the summary above is the result
  pack_all $1
  mark done
  ;;
137)
  # (warm, nothing staged) the tree build kernel at 2, 4 (the kernel's), 8 and 16 warps a
  # row's program, and at 4 with each depth's full sort instead of the top-W (at 63 nodes
  # and batch 1 it is one program, ~64-100 us of the 8B drafter block: 15 selections from
  # 512 candidate keys one after another); every case's trees compared
  mark "tree build warps"
  timeout 150 python3 scripts/gpu/tree_build_bench.py --warps 2,4,8,16 --sort 2>&1 \
    | grep -v Warn | tee "$OUT/tree_build_warps.txt" | tail -8
  pack_all $1
  mark done
  ;;
134)
  # (after 0, or warm) the 8B drafter block as it is now (the log-sum-exp from the
  # vocabulary top-K's own passes, no log-softmax tensor; the draft half's inputs from two
  # kernels, the tree build writing the round's buffers), with torch.logsumexp beside the
  # top-K (a pass over the logits, as the log-softmax was), and with the inputs from
  # PyTorch's builders (~30 launches); tokens equal ar's. Then the top-K kernels' tokens
  # and log-sum-exp against torch on the GPU
  shapes8b_runs - no-fused-lse no-draft-prologue
  mark "check_kernels vocab_topk"
  timeout 100 python3 scripts/gpu/check_kernels.py --only vocab_topk 2>&1 | grep -v Warn \
    | tail -4
  pack_all $1
  mark done
  ;;
135)
  # (after 0-3, carry .carry/g4) the demo's batch-1 table as it is now, with torch.logsumexp
  # beside the top-K, and with the draft half's inputs from PyTorch's builders (each row's
  # tokens compared with ar's)
  [ -f $T/config.json ] || stage_target
  mark "engine_bench speed"
  timeout 300 python3 scripts/gpu/engine_bench.py --stages speed --target $T --no-hf \
    --speed-variants "plain,torch logsumexp,torch prologue" \
    --speed-modes ar,linear,tree@16,tree@32 \
    --humaneval $H 2>&1 | grep -v Warn | tail -8
  pack_all $1
  mark done
  ;;
130)
  # (after 0-3, carry .carry/g4) `ddtree serve --mps` (auto, the default: the drafter and
  # the verifier share the GPU, so serve starts a private MPS server and runs them as its
  # clients): the real-MPS test, a CUDA client whose pipe directory has no daemon (runs
  # without MPS: what compose's clients do when its mps service idles), then tree@16 c8 /
  # c1 and ar c8 through serve under MPS (auto), tree@16 c8 / c1 with --mps off, and
  # tree@16 in process over the same 160 requests: the gateway's ratios
  [ -f $T/config.json ] || stage_target
  mark "MPS tests on the GPU"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/test_mps.py 2>&1 | tail -3
  mkdir -p /tmp/mps-empty
  CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-empty timeout 60 python3 -c \
    "import torch; x = torch.ones(4, device='cuda') + 1; print('client without a daemon:', float(x.sum()))" 2>&1 | tail -1
  SHARED=1 RUN=mpsauto serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8" 1
  zcat "$OUT"/serve_*mpsauto*.log.gz 2>/dev/null | grep -h "ddtree mps\|MPS" | head -3
  SHARED=1 RUN=nomps SERVE_EXTRA="--mps off" serve_ahead 1 "tree:16:8 tree:16:1" 1
  mark "tree@16 in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess tree 16 "$OUT/report_inprocess.json"
  pack_all $1
  mark done
  ;;
131)
  # (warm, or after 0 alone: random 8B weights, no target) the 8B drafter block with the
  # tuned top-K tournament shapes (the default now), without them, and with the drafter's
  # GEMMs in cuBLAS (not batch invariant: only the drafts may change); tokens equal ar's
  shapes8b_runs - no-topk-shapes drafter-cublas
  pack_all $1
  mark done
  ;;
133)
  # (warm, nothing staged) the 8B GEMMs at the drafter block's rows (16, 32) and a verify's
  # (64): the committed tilings against other M x N tiles (bitwise the same rows) and
  # cuBLAS (scripts/gpu/gemm_rows_sweep.py --model qwen3)
  mark "gemm rows sweep, 8B shapes"
  timeout 300 python3 scripts/gpu/gemm_rows_sweep.py --model qwen3 --rows 16,32,64 \
    --json-out "$OUT/gemm_rows_8b.json" 2>&1 | grep -v Warn | tee "$OUT/gemm_rows_8b.txt" | tail -9
  pack_all $1
  mark done
  ;;
132)
  # (after 0-3 and 130: the target staged) the batch-1 table with the tuned top-K shapes,
  # without them, and with the drafter's GEMMs in cuBLAS; transformers last
  [ -f $T/config.json ] || stage_target
  mark "engine_bench speed"
  timeout 280 python3 scripts/gpu/engine_bench.py --stages speed --target $T \
    --speed-variants "plain,plain top-K shapes,drafter cuBLAS" --humaneval $H 2>&1 \
    | grep -v Warn | tail -16
  pack_all $1
  mark done
  ;;
125)
  # (warm after 124) the concurrency curves at the current engine (engine_bench.py
  # --stages load: per concurrency c1 / c8 / c32 / c64 ar, tree@16, tree@64, auto, cold
  # then warm, then ar and auto warm once more, alternated: their means)
  [ -f $T/config.json ] || stage_target
  [ -f /tmp/linear_tuned.json ] && cp /tmp/linear_tuned.json ddtree/kernels/linear_tuned.json
  mark "load curves"
  timeout 280 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H ${LOAD_ARGS:-} 2>&1 | grep -v Warn | tail -49 | tee "$OUT/load_curves.txt"
  pack_all $1
  mark done
  ;;
122)
  # (after 0-3, carry .carry/g4) with the round_commit kernels: their GPU tests again (the
  # verify_into one builds its model on the GPU now), the batch-1 table beside
  # transformers, the 8B shapes once
  [ -f $T/config.json ] || stage_target
  mark "round_commit tests on the GPU"
  DDTREE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_round_commit.py 2>&1 | tail -3
  mark "engine_bench speed plain"
  speed_table plain
  shapes8b_runs -
  pack_all $1
  mark done
  ;;
123)
  # (warm after 122) call 117's points through `ddtree serve` (tree@16 c8 / c1, ar c8 /
  # c1) and in process over the same 160 requests: the gateway's ratios with round_commit
  [ -f $T/config.json ] || stage_target
  SHARED=1 RUN=commit serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  mark "ar / tree@16 in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-300
  pack_all $1
  mark done
  ;;
121)
  # (after 0-3, carry .carry/g4) the verify half's bookkeeping in three kernels
  # (EngineConfig.round_commit, ddtree/kernels/round_commit.py): its tests on the GPU
  # (bitwise the PyTorch round's tables, state, pool; pytest carried in .whl), the batch-1
  # table with and without, every mode against ar at c1 and c8, the tree@16 round traced
  # in process again (kernels a round)
  [ -f $T/config.json ] || stage_target
  mark "round_commit tests on the GPU"
  DDTREE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_round_commit.py 2>&1 | tail -4
  mark "engine_bench speed plain, no round commit"
  speed_table "plain,no round commit"
  mark "exact"
  exact_modes
  dir=/tmp/trace_tree; rm -rf $dir; mkdir -p $dir; touch $dir/go
  mark "in process, tree c1 traced"
  DDTREE_TRACE_DIR=$dir DDTREE_TRACE_ROUNDS=300:200 timeout 150 python3 -m ddtree.cli bench \
    --target $T --drafter $D --prompts humaneval --num-prompts 12 --num-requests 12 \
    --modes tree --budgets 16 --concurrency 1 --max-tokens 256 --no-progress 2>&1 | grep humaneval
  python3 scripts/trace_kernels.py $dir/engine-*.json 40 | tee "$OUT/kernels_tree_c1.txt" | head -40
  pack_all $1
  mark done
  ;;
120)
  # (after 0-3, carry .carry/g4; twenty-sixth session) the batch-1 table beside
  # transformers with the tree build's loads before its loop (not yet measured end to
  # end), then kernel tables of the current round: the engine in process traced at c1
  # (ddtree/round_trace.py, 200 rounds after 300), tree@16 then ar, and the 8B shapes'
  # ar steps and tree@63 rounds (engine_bench --stages profile8b); scripts/trace_kernels.py
  [ -f $T/config.json ] || stage_target
  mark "engine_bench speed plain"
  speed_table plain
  for m in tree ar; do
    dir=/tmp/trace_$m; rm -rf $dir; mkdir -p $dir; touch $dir/go
    mark "in process, $m c1 traced"
    DDTREE_TRACE_DIR=$dir DDTREE_TRACE_ROUNDS=300:200 timeout 150 python3 -m ddtree.cli bench \
      --target $T --drafter $D --prompts humaneval --num-prompts 12 --num-requests 12 \
      --modes $m --budgets 16 --concurrency 1 --max-tokens 256 --no-progress 2>&1 | grep humaneval
    python3 scripts/trace_kernels.py $dir/engine-*.json 40 | tee "$OUT/kernels_${m}_c1.txt" | head -30
    (cd $dir && tar -czf "$OUT/trace_${m}_c1.tar.gz" ./*.json)
  done
  mark "profile8b"
  timeout 200 python3 scripts/gpu/engine_bench.py --stages profile8b --target $T \
    --humaneval $H 2>&1 | grep -v Warn | tail -3
  for f in "$OUT"/trace8b_*.json; do
    python3 scripts/trace_kernels.py "$f" 40 > "${f%.json}_kernels.txt"; head -28 "${f%.json}_kernels.txt"
  done
  pack_all $1
  mark done
  ;;
116)
  # (after 0-3, carry .carry/g4) RoPE and the KV store as the QKV GEMM's epilogue
  # (EngineConfig.rope_epilogue, on; the demo target's QKV does not split K and has no
  # head norms): the pieces alone, bitwise (scripts/gpu/rope_bench.py), the batch-1 table
  # with and without it beside transformers (every row against the plain ar tokens; the
  # o_proj split is in the committed table now), then every mode against ar at c1 and c8
  [ -f $T/config.json ] || stage_target
  mark "rope_bench"
  timeout 120 python3 scripts/gpu/rope_bench.py 2>&1 | grep -v Warn | tail -12
  cp /tmp/rope_bench.json "$OUT/" 2>/dev/null
  mark "engine_bench speed plain, no rope epilogue"
  speed_table "plain,no rope epilogue"
  mark "exact"
  exact_modes
  pack_all $1
  mark done
  ;;
119)
  # (after 0-3 on a fresh machine, carry .carry/g4) the batch-1 table beside transformers
  # on one more machine (transformers' figure follows the machine: 263-348 tok/s in
  # lease 34)
  [ -f $T/config.json ] || stage_target
  mark "engine_bench speed plain"
  speed_table plain
  pack_all $1
  mark done
  ;;
118)
  # (at ccebe82, reverted: the drafter's side measured no faster) (after 0-3, carry
  # .carry/g4) the RoPE epilogue with Qwen3's head norms too (the demo
  # drafter's QKV, its context store's; one fixed pairwise tree for a head's squares in
  # both kernels): the pieces, bitwise; the batch-1 table with and without the epilogue;
  # every mode against ar at c1 and c8; the 8B shapes once (its drafter's context store
  # now takes RoPE from the QKV partials)
  [ -f $T/config.json ] || stage_target
  mark "rope_bench"
  timeout 120 python3 scripts/gpu/rope_bench.py 2>&1 | grep -v Warn | tail -20
  cp /tmp/rope_bench.json "$OUT/" 2>/dev/null
  mark "engine_bench speed plain, no rope epilogue"
  speed_table "plain,no rope epilogue"
  mark "exact"
  exact_modes
  shapes8b_runs -
  pack_all $1
  mark done
  ;;
117)
  # (after 0-3 on a fresh machine, carry .carry/g4) with the RoPE epilogue: the batch-1
  # table beside transformers once more (another machine's transformers), then call 105's
  # points through `ddtree serve` (tree@16 c8 / c1, ar c8 / c1) and in process over the
  # same 160 requests: the gateway's ratios with this session's kernels
  [ -f $T/config.json ] || stage_target
  mark "engine_bench speed plain"
  speed_table plain
  SHARED=1 RUN=rope serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  mark "ar / tree@16 in process, 160 requests"
  BENCH_TIMEOUT=240 NUM=160 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-300
  pack_all $1
  mark done
  ;;
115)
  # (after 0-3, carry .carry/g4) the demo's o_proj split 3 ways (call 112: ar +3%; its
  # norm then rides on the reduce too): every mode against ar at c1 and c8 with that
  # tiling table
  [ -f $T/config.json ] || stage_target
  python3 - <<'PY'
import json
table = json.load(open("ddtree/kernels/linear_tuned.json"))
table["576x576:bfloat16"] = dict(table["576x576:bfloat16"], split_k=3)
json.dump(table, open("/tmp/table_o3.json", "w"))
PY
  mark "exact, o_proj split 3"
  timeout 150 python3 scripts/gpu/engine_bench.py --stages exact --target $T \
    --linear-table /tmp/table_o3.json --humaneval $H 2>&1 \
    | grep -E " c[18]: |Error|error" | grep -v Warn | tail -20
  pack_all $1
  mark done
  ;;
99)
  # (warm after 97) the shared link with the verifier and the drafter as clients of one
  # MPS server (a user-space daemon, started here and quit at the end; the GPU's compute
  # mode is left as it is): their kernels then share the GPU instead of time-slicing two
  # contexts; tree@16 c8 / c1 and ar c8 (the exactness check's reference)
  [ -f $T/config.json ] || stage_target
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && mark "MPS daemon started"
  SHARED=1 RUN=mps serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8" 1
  echo quit | nvidia-cuda-mps-control; sleep 1
  tail -5 $CUDA_MPS_LOG_DIRECTORY/control.log > "$OUT/mps_control.txt" 2>&1
  pack_all $1
  mark done
  ;;
100)
  # (after 0-3, carry .carry/g4) the shared link when the drafter dies: `ddtree serve`
  # (defaults), tree@16 c$C (C=8; 160 requests) with the drafter SIGKILLed $KILL_AT s in
  # (KILL_AT=3; the clients take a few seconds to start); every
  # request must complete (rows continue in ar), the server stays up, the link is
  # attached again to the restarted drafter (tree@16 c1, 24 requests, drafts again);
  # ar c8 last (the exactness check's reference)
  [ -f $T/config.json ] || stage_target
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" start_serve _kill || exit 3
  timeout 200 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts 160 --num-requests 160 --max-tokens 256 --no-progress --client-processes 2 \
    --modes tree --budgets 16 --concurrency "${C:-8}" --json-out "$OUT/report_kill_tree_c8.json" 2>&1 \
    | grep humaneval &
  bench=$!
  sleep "${KILL_AT:-3}"; kill -9 "$(cat $OUT/pids/drafter.pid)"; mark "drafter SIGKILLed"
  wait $bench
  sleep 8
  mark "after the restart: tree@16 c1, 24 requests"
  timeout 100 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts 24 --num-requests 24 --max-tokens 256 --no-progress \
    --modes tree --budgets 16 --concurrency 1 --json-out "$OUT/report_after_tree_c1.json" 2>&1 | grep humaneval
  timeout 100 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts 160 --num-requests 160 --max-tokens 256 --no-progress --client-processes 2 \
    --modes ar --concurrency 8 --json-out "$OUT/report_ar_c8.json" 2>&1 | grep humaneval
  for point in "$OUT"/report_kill_tree_c8.json "$OUT"/report_after_tree_c1.json; do
    echo "$(basename "$point"): $(python3 scripts/gpu/ar_mismatches.py "$point" "$OUT/report_ar_c8.json" | tail -1)"
  done
  grep -ho "shared_draft_[a-z]*\|drafter_lost\|drafter_connected\|drafter_fallback_ar\|step_failed\|supervis[a-z_]*\|restart[a-z_]*" "$OUT/serve_kill.log" | sort | uniq -c
  curl -s -o /dev/null -w "health after: %{http_code}\n" http://127.0.0.1:8000/health
  kill $S; wait $S 2>/dev/null
  gzip -f "$OUT/serve_kill.log"
  pack_all $1
  mark done
  ;;
96)
  # (after 0-3, carry .carry/g4) where a c8 round through the services goes with the Draft
  # stream over the Unix socket: `ddtree serve` (defaults), tree@16 c8 (160 requests) with
  # py-spy (1 kHz, idle threads) on the verifier and the drafter for 6 s once the engine's
  # round counter moves (call 93's windows missed the traffic), the rounds in the window
  # from the verifier's metrics at its edges
  [ -f $T/config.json ] || stage_target
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" start_serve _spy || exit 3
  rounds() { curl -s http://127.0.0.1:8000/metrics | awk '/^ddtree:engine_rounds_total/ {print $2}'; }
  SPY=/tmp/site/bin/py-spy
  base=$(rounds)
  mark "tree@16 c8, 160 requests (rounds so far: $base)"
  timeout 200 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts 160 --num-requests 160 --max-tokens 256 --no-progress --client-processes 2 \
    --modes tree --budgets 16 --concurrency 8 --json-out "$OUT/report_c8.json" 2>&1 \
    | grep humaneval &
  bench=$!
  for _ in $(seq 1 120); do
    now=$(rounds); python3 -c "import sys; sys.exit(float('$now') - float('$base') < 100)" && break
    sleep 0.25
  done
  before=$(rounds); mark "traffic (rounds $before): py-spy 6 s"
  spies=""
  for svc in verifier drafter; do
    timeout 20 $SPY record --pid "$(cat $OUT/pids/$svc.pid)" --duration 6 --rate 1000 \
      --nonblocking --idle --threads --format raw -o "$OUT/spy_c8_$svc.txt" >/dev/null 2>&1 &
    spies="$spies $!"
  done
  sleep 6.3; after=$(rounds); wait $spies
  echo "rounds in the window: $before -> $after"
  wait $bench
  for svc in verifier drafter; do
    python3 scripts/gpu/spy_summary.py "$OUT/spy_c8_$svc.txt" --top 30 --threads 5 \
      > "$OUT/spy_c8_${svc}_summary.txt" 2>&1
    head -12 "$OUT/spy_c8_${svc}_summary.txt"
  done
  kill $S; wait $S 2>/dev/null
  gzip -f "$OUT/serve_spy.log" "$OUT"/spy_c8_verifier.txt "$OUT"/spy_c8_drafter.txt
  pack_all $1
  mark done
  ;;
94)
  # (after 0-3, carry .carry/g4) the Draft stream over the drafter's Unix socket (the
  # default) against gRPC through `ddtree serve`: tree@16 and ar at c8 / c1 with the
  # socket, then tree@16 at c8 / c1 over gRPC (call 95 runs gRPC first, then the socket)
  [ -f $T/config.json ] || stage_target
  SOCK=1 serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  SOCK=0 serve_ahead 1 "tree:16:8 tree:16:1" 1
  pack_all $1
  mark done
  ;;
95)
  # (warm after 94) the other order: gRPC then the socket, tree@16 at c8 / c1; then tree@16
  # and ar in process (`ddtree bench`, 160 requests) for the through-the-gateway ratios
  [ -f $T/config.json ] || stage_target
  SOCK=0 RUN=b serve_ahead 1 "tree:16:8 tree:16:1" 1
  SOCK=1 RUN=b serve_ahead 1 "tree:16:8 tree:16:1" 1
  mark "in process, 160 requests"
  NUM=160 BENCH_TIMEOUT=200 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-200
  pack_all $1
  mark done
  ;;
93)
  # (after 0-3, carry .carry/g4) where the drafter service's round goes at 1 and 8 rows:
  # the remote round's stage split in one process (loopback gRPC, tree@16, the drafter's
  # decode / graph / encode timed by wrapping its methods), then `ddtree serve` (tree@16,
  # the defaults) at c8 and c1 with py-spy on the drafter and the verifier (idle threads
  # too, 1 kHz), the rounds counted from the verifier's metrics before and after
  [ -f $T/config.json ] || stage_target
  mark "remote profile, tree@16, rows 1 and 8"
  remote_profile --rows 1,8 --rounds 80 --budget 16 > "$OUT/remote_profile.txt" 2>&1
  grep -A4 "^per-round" "$OUT/remote_profile.txt"
  mark "serve (services, --max-budget 16 --max-num-seqs 8)"
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" start_serve _prof || exit 3
  for c in 8 1; do
    mark "tree@16 c$c, 160 requests, py-spy on drafter and verifier"
    curl -s http://127.0.0.1:8000/metrics | grep -v "^#" > "$OUT/metrics_c${c}_before.txt"
    spy_start 1000 "c$c" verifier drafter
    bench_url tree 16 $c "$OUT/report_c$c.json"
    spy_summaries "c$c" drafter verifier
    curl -s http://127.0.0.1:8000/metrics | grep -v "^#" > "$OUT/metrics_c${c}_after.txt"
  done
  kill $S; wait $S 2>/dev/null
  gzip -f "$OUT/serve_prof.log"
  pack_all $1
  mark done
  ;;
92)
  # (after 0-3, carry .carry/g4; lease 25 ran it with REMOTE_ONLY=1) why the
  # round through a drafter service grows more with rows than in process (3.8 -> 5.1 ms
  # against 1.35 -> 2.0 from c1 to c8): the verifier's engine traced through a drafter
  # service at tree@16 c1 / c8 (its kernels, gaps and host stages beside call 88's
  # in-process trace), then the same in process again on this machine (REMOTE_ONLY=1:
  # not)
  [ -f $T/config.json ] || stage_target
  trace_remote --trace tree@16/c1,tree@16/c8 --trace-steps 60 --trace-after 40
  [ -n "$REMOTE_ONLY" ] || TRACE_TIMEOUT=200 trace_local --modes tree@16 --trace tree@16/c1,tree@16/c8 \
    --trace-steps 60 --trace-after 40
  pack_all $1
  mark done
  ;;
91)
  # (after 0-3, carry .carry/g4) issue 8's ratios on one machine at the new defaults
  # (send-ahead, the drafter's ContextGraphs): through `ddtree serve` tree@16 / ar at c8 /
  # c1 (160 requests), the same in process (`ddtree bench`), then the speed table beside
  # transformers' static-cache generate
  [ -f $T/config.json ] || stage_target
  serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  mark "in process, 160 requests"
  NUM=160 BENCH_TIMEOUT=200 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-200
  mark "engine_bench speed"
  timeout 170 python3 scripts/gpu/engine_bench.py --stages speed \
    --speed-modes ar,linear,tree@16,tree@32,shadow@16 --speed-variants plain --target $T \
    --humaneval $H 2>&1 | grep -E "tok/s|Error|error" | grep -v Warn | tail -12
  pack_all $1
  mark done
  ;;
90)
  # (after 89, warm) issue 7's table with the drafter's ContextGraphs on (the default
  # since lease 23): tree@16 and ar at c8 / c1 through `ddtree serve`
  [ -f $T/config.json ] || stage_target
  serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" 1
  pack_all $1
  mark done
  ;;
89)
  # (after 87, warm) the drafter's ContextGraphs on then off (call 87 ran them off first,
  # on last: c8 3,564.6 -> 4,050.1, confounded with run order), both with send-ahead
  [ -f $T/config.json ] || stage_target
  serve_ahead 1 "tree:16:8 tree:16:1" 1
  serve_ahead 1 "tree:16:8 tree:16:1" 0
  pack_all $1
  mark done
  ;;
88)
  # (after 0-3, carry .carry/g4) the in-process engine traced at tree@16 c1 and c8 (what
  # grows in the GPU round with its rows: 1.35 -> 2.0 ms from 1 to 8 rows; lease 22's
  # call 86 ran out of time before it)
  [ -f $T/config.json ] || stage_target
  TRACE_TIMEOUT=300 trace_local --modes tree@16 --trace tree@16/c1,tree@16/c8 \
    --trace-steps 60 --trace-after 40
  pack_all $1
  mark done
  ;;
84|85|86)
  # (84, 86: after 0-3, carry .carry/g4; 85: warm after 84) the drafter asked for a
  # round's next trees as soon as the last round's rows hold its state (send_ahead)
  # against in its own step (84 / 85 measured it after the harvest; 86 before the results
  # are built). 86: both variants through the three processes on one machine, then the
  # drafter service's first contexts eager (DDTREE_CONTEXT_GRAPHS=0) against in graphs,
  # then the in-process engine traced at tree@16 c1 / c8 (what grows with the rows)
  [ -f $T/config.json ] || stage_target
  case $1 in
    84) trace_remote --in-step; serve_ahead 1 "tree:16:8 tree:16:1 ar:1:8 ar:1:1" ;;
    85) serve_ahead 0 "tree:16:8 tree:16:1"
        mark "in process, 160 requests"
        NUM=160 BENCH_TIMEOUT=250 bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
        python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-200
        ;;
    86) serve_ahead 1 "tree:16:8 tree:16:1" 1
        serve_ahead 1 "tree:16:8 tree:16:1" 0
        serve_ahead 0 "tree:16:8 tree:16:1" 1
        TRACE_TIMEOUT=100 trace_local --modes tree@16 --trace tree@16/c1,tree@16/c8 \
          --trace-steps 60 --trace-after 40
        (cd "$OUT" && gzip -f trace_*.json 2>/dev/null) ;;
  esac
  pack_all $1
  mark done
  ;;
83)
  # (after 0-3 with py-spy among the wheels, carry .carry/g4) where the three processes'
  # host time goes: `ddtree serve --max-budget 16 --max-num-seqs 8` (a short drafter
  # warm-up), tree@16 through the gateway at c8 (160 requests, two client processes)
  # with py-spy sampling the verifier, drafter and gateway (nonblocking, idle
  # threads too, per thread; SPY_ARGS=--gil: only the threads holding the GIL), then c1
  # (160 requests: the same prompts) with it; raw stacks in $OUT
  [ -f $T/config.json ] || stage_target
  mark "serve (services, --max-budget 16 --max-num-seqs 8)"
  SERVE_ARGS="--budget 16 --max-budget 16 --max-num-seqs 8 --pid-dir $OUT/pids" start_serve _prof || exit 3
  grep -h warmed_up "$OUT/serve_prof.log" | cut -c1-200
  SPY=/tmp/site/bin/py-spy
  $SPY dump --pid "$(cat $OUT/pids/verifier.pid)" >/dev/null 2>"$OUT/pyspy_check.txt" \
    && echo "py-spy dump ok" || { echo "py-spy refused:"; head -3 "$OUT/pyspy_check.txt"; }
  for point in "8 160 1" "1 160 1"; do  # one prompt set at both (acceptance differs by set)
    set -- $point; spies=""
    mark "tree@16 c$1, $2 requests, py-spy $3"
    if [ "$3" = 1 ]; then
      for svc in verifier drafter gateway; do
        (sleep 4; timeout 30 $SPY record --pid "$(cat $OUT/pids/$svc.pid)" --duration 10 \
          --rate 250 --nonblocking ${SPY_ARGS:---idle} --threads --format raw \
          -o "$OUT/spy_c$1_$svc.txt" >/dev/null 2>&1) &
        spies="$spies $!"
      done
    fi
    timeout 200 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
      --num-prompts $2 --num-requests $2 --max-tokens 256 --no-progress --client-processes 2 \
      --modes tree --budgets 16 --concurrency $1 --json-out "$OUT/report_c$1_$3.json" 2>&1 \
      | grep humaneval
    [ -n "$spies" ] && wait $spies
    curl -s http://127.0.0.1:8000/metrics | grep -E "batch_size" | grep -v "^#" \
      > "$OUT/metrics_c$1_$3.txt"
  done
  kill $S; wait $S 2>/dev/null
  (cd "$OUT" && gzip -f spy_*.txt report_*.json 2>/dev/null; gzip -f serve_prof.log)
  mark done
  ;;
82)
  # (after 0, or on any machine: random weights, no staging) the invariant GEMM's row
  # tiles at the static prefill's token buckets (an admission's ~2.2 ms of GPU is mostly
  # its GEMMs at the tiles swept for <= 264 rows; wider M tiles keep the K order)
  mark "gemm rows sweep at prefill sizes"
  timeout 500 python3 scripts/gpu/gemm_rows_sweep.py --rows 128,256,512,1024,2048 \
    --json-out "$OUT/gemm_rows_prefill.json" 2>&1 | grep -v Warn | tail -60
  mark done
  ;;
81)
  # (after 0-3, carry .carry/g4) through a drafter service (the three processes' verifier
  # engine without the gateway): tree@16 c1 / c8 with the halves taking turns and without
  # (lease 6 measured alternation slower; the hop has changed since)
  [ -f $T/config.json ] || stage_target
  trace_remote --alternate
  mark done
  ;;
80)
  # (after 0-3, carry .carry/g4) call 77 again on another machine, --max-num-seqs 8 (the
  # drafter service's warm-up then covers batches 1-8 only: 191 s in call 77)
  [ -f $T/config.json ] || stage_target
  NUM=160 BENCH_TIMEOUT=400 CLIENTS=2 EXTRA_SERVE="--max-num-seqs 8" placements_bench \
    services --modes ar,tree --budgets 16 --concurrency 1,8 || exit 3
  mark done
  ;;
77|78)
  [ -f $T/config.json ] || stage_target
  placement=$([ "$1" = 78 ] && echo colocated || echo services)
  NUM=160 BENCH_TIMEOUT=500 CLIENTS=2 placements_bench $placement --modes ar,tree \
    --budgets 16 --concurrency 1,8 || exit 3
  mark done
  ;;
75)
  # (after 1-3, carry .carry/g4) the engine under continuous load in process and through a
  # drafter service, `ddtree bench` in process, then through the gateway colocated and in
  # three processes (lease 18 ran it at 2d6c5e1, with the first drafter context in graphs)
  [ -f $T/config.json ] || stage_target
  trace_local --modes ar,tree@16
  trace_remote
  bench_inprocess_checked
  mark "through the gateway"
  NUM=40 BENCH_TIMEOUT=150 placements_bench "colocated services" --modes ar,tree \
    --budgets 16 --concurrency 1,8
  (cd "$OUT" && tar -czf logs.tar.gz trace_engine_*.json drafter.log && rm -f \
    trace_engine_*.json drafter.log)
  mark done
  ;;
74)
  # (after 1-3, carry .carry/g4) call 73's engine trace with the admission's blocking copy
  # gone, in process and through a drafter service (the three processes' verifier engine
  # without the gateway), `ddtree bench` in process, then colocated through the gateway
  [ -f $T/config.json ] || stage_target
  trace_local --modes ar,tree@16 --sync-prefill --trace tree@16/c8
  rm -f "$OUT/trace_tree16_c8_sync.json.gz"
  trace_remote --trace tree@16/c8
  bench_inprocess_checked
  mark "colocated"
  NUM=40 BENCH_TIMEOUT=150 placements_bench colocated --modes ar,tree --budgets 16 \
    --concurrency 1,8
  (cd "$OUT" && tar -czf traces.tar.gz *.txt trace_engine_*.json drafter.log && rm -f *.txt \
    trace_engine_*.json drafter.log)
  mark done
  ;;
73)
  # (after 1-3, carry .carry/g4) the engine under continuous load without the bench's
  # harness: the host's time per step part, the prefill's first tokens read after the
  # round's launch (deferred) against at once (sync), a trace of tree@16 c8's steps; then
  # `ddtree bench` in process and through the three processes, each sample against ar's
  [ -f $T/config.json ] || stage_target
  mark "trace_engine"
  timeout 260 python3 scripts/gpu/trace_engine.py --target $T --drafter $D --humaneval $H \
    --modes ${TRACE_MODES:-ar,tree@16} --concurrency 1,8 --requests 40 --sync-prefill \
    --trace tree@16/c8 2>&1 | grep -v Warn | cut -c1-400 | tail -70
  bench_inprocess_checked
  mark "three processes"
  NUM=40 BENCH_TIMEOUT=150 placements_bench services --modes ar,tree --budgets 16 \
    --concurrency 1,8 || exit 3
  mark done
  ;;
58|59)
  [ -f $T/config.json ] || stage_target
  placement=$([ "$1" = 58 ] && echo colocated || echo services)
  NUM=160 BENCH_TIMEOUT=400 CLIENTS=2 placements_bench $placement \
    --modes ar,tree,auto --budgets 16 --concurrency 1,8 || exit 3
  mark done
  ;;
68)
  # colocated, ar / tree@16 at c1 / c8 (160 requests, two client processes) with two
  # gateway processes, then one: is the c8 gap to in process (0.92x, TTFT p50 13.5 ms
  # against 3.3 in call 58) the gateway's?
  [ -f $T/config.json ] || stage_target
  for workers in 2 1; do
    GATEWAY_WORKERS=$workers NUM=160 BENCH_TIMEOUT=200 CLIENTS=2 placements_bench colocated \
      --modes ar,tree --budgets 16 --concurrency 1,8 || exit 3
    mv "$OUT/raw.tar.gz" "$OUT/raw_gateway$workers.tar.gz"
  done
  mark done
  ;;
67)
  # the committed state after lease 16's fixes (Row.emit, 64 / 2 / 2 at head dim 64):
  # every mode against ar, the speed table beside transformers, 160 requests in process
  [ -f $T/config.json ] || stage_target
  mark "engine_bench exact, 16 prompts"
  timeout 200 python3 scripts/gpu/engine_bench.py --stages exact --target $T --humaneval $H \
    --num-prompts 16 2>&1 | grep -v Warn | grep " c[18]: "
  mark "engine_bench speed"
  timeout 200 python3 scripts/gpu/engine_bench.py --stages speed \
    --speed-modes ar,linear,tree@16,tree@32,shadow@16 --speed-variants plain --target $T \
    --humaneval $H 2>&1 | grep -E "tok/s|Error|error" | grep -v Warn | tail -12
  mark "in process, 160 requests"
  NUM=160 BENCH_TIMEOUT=250 bench_inprocess ar,tree,auto 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-200
  mark done
  ;;
66)
  # which of the two lease 15's 64/2/2 changed: the target's attention (its modes then
  # disagree) or the drafter's trees (an engine that mishandles some trees); first the
  # kernel's twin checks across key blocks and splits (lease 15's one case crossed neither)
  mark "attn_sweep --twins"
  timeout 200 python3 scripts/gpu/attn_sweep.py --twins 64/4/3 64/2/2 64/4/2 32/2/2 2>&1 \
    | grep -v Warn
  [ -f $T/config.json ] || stage_target
  for pair in "- 64/2/2" "64/2/2 -" "64/2/2 64/2/2"; do
    set -- $pair
    mark "engine_bench exact (40 prompts), target tiles $1, drafter tiles $2"
    timeout 200 python3 scripts/gpu/engine_bench.py --stages exact --target $T \
      --humaneval $H --num-prompts 40 --exact-modes ar,tree@16,tree@64 \
      $([ $1 != - ] && echo --target-attn-tiles $1) \
      $([ $2 != - ] && echo --drafter-attn-tiles $2) 2>&1 | grep -v Warn | grep " c[18]: "
    mv "$OUT/engine_exact.json" "$OUT/engine_exact_${1//\//-}_${2//\//-}.json" 2>/dev/null
  done
  mark done
  ;;
66b)
  # lease 15's in-process bench with the demo head dim's tree attention at 64/2/2, at
  # 64/4/3, at 64/2/2 again (the exact stage never showed lease 15's 2 samples: it ignores
  # EOS, and they were a stop token accepted past max_tokens, Row.emit, fixed since)
  [ -f $T/config.json ] || stage_target
  for tiles in 64/2/2 64/4/3 64/2/2; do
    mark "in process, tree attention at $tiles"
    timeout 170 python3 -c "
import sys, ddtree.kernels.tree_attention as attention
attention.ATTN_TILES[64] = tuple(int(x) for x in '$tiles'.split('/'))
from ddtree.cli import main
sys.exit(main(sys.argv[1:]))" bench --target $T --drafter $D --prompts humaneval \
      --num-prompts 40 --num-requests 40 --modes ar,tree --budgets 16 --concurrency 1,8 \
      --max-tokens 256 --no-progress --json-out "$OUT/inproc_${tiles//\//-}_$(date +%s).json" \
      2>&1 | grep -v Warn | grep -i "humaneval\|error\|differ"
  done
  mark done
  ;;
64)
  mark "attn_sweep"
  timeout 500 python3 scripts/gpu/attn_sweep.py --json-out "$OUT/attn_sweep.json" 2>&1 \
    | grep -v '^{' | grep -v Warn
  mark done
  ;;
60)
  for fused in no-fused fused; do
    mark "shapes8b --$fused"
    timeout 200 python3 scripts/gpu/engine_bench.py --stages shapes8b --$fused --target $T \
      --humaneval $H 2>&1 | grep -v Warn | grep -E "^8B|Error"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_${fused}_$(date +%s).json"
  done
  mark "profile8b, DDTREE_PDL=0"
  DDTREE_PDL=0 timeout 150 python3 scripts/gpu/engine_bench.py --stages profile8b --target $T \
    --humaneval $H 2>&1 | grep -v Warn | head -30
  rm -f "$OUT"/trace8b_*.json
  mark done
  ;;
56)
  timeout 200 python3 scripts/gpu/check_kernels.py --only vocab_topk 2>&1 | grep -v Warn \
    | tail -16
  ;;
55)
  [ -f $T/config.json ] || stage_target
  NUM=160 BENCH_TIMEOUT=300 bench_inprocess ar,tree,auto 32 "$OUT/report_inprocess_b.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess_b.json" | tail -1 | cut -c1-200
  ;;
52|57)
  [ -f $T/config.json ] || stage_target
  if [ "$1" = 52 ]; then
    mark "check_kernels vocab_topk"
    timeout 120 python3 scripts/gpu/check_kernels.py --only vocab_topk 2>&1 | grep -v Warn \
      | tail -14
  fi
  mark "engine_bench speed"
  timeout 400 python3 scripts/gpu/engine_bench.py --stages speed \
    --speed-modes ar,tree@16,tree@32 --speed-variants "plain,torch top-K" --target $T \
    --humaneval $H 2>&1 | grep -E "tok/s|Error|error" | grep -v Warn | tail -12
  mark done
  ;;
53)
  [ -f $T/config.json ] || stage_target
  export NUM=160 BENCH_TIMEOUT=290
  mark "bench in process (160 requests)"
  bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-300
  (cd "$OUT" && gzip report_inprocess.json)
  placements_bench colocated --modes ar,tree,auto --budgets 16 --concurrency 1,8 || exit 3
  mark done
  ;;
54)
  [ -f $T/config.json ] || stage_target
  NUM=160 BENCH_TIMEOUT=400 placements_bench services --modes ar,tree,auto --budgets 16 \
    --concurrency 1,8 || exit 3
  mark done
  ;;
47)
  [ -f $T/config.json ] || stage_target
  mark "engine_bench profile, DDTREE_PDL=0"
  DDTREE_PDL=0 timeout 300 python3 scripts/gpu/engine_bench.py --stages profile --target $T \
    --humaneval $H --profile-modes "${PROFILE_MODES:-ar,tree@16,tree@32}" \
    ${PREFILL_PROFILE:---prefill-profile} 2>&1 | grep "^profile"
  mark done
  ;;
50)
  [ -f $T/config.json ] || stage_target
  for cache in cold warm; do
    mark "drafter warm-up timing ($cache Triton cache)"
    TRITON_CACHE_DIR=/tmp/tc50 timeout 280 python3 scripts/gpu/warmup_timing.py --target $T \
      --drafter $D --json-out "$OUT/warmup_$cache.json" 2>&1 | grep -v Warn \
      > "$OUT/warmup_$cache.txt"
    grep -E "^(load|batch +(64|8|1) |[0-9]+ shapes)" "$OUT/warmup_$cache.txt"
  done
  mark done
  ;;
51)
  [ -f $T/config.json ] || stage_target
  export TRITON_CACHE_DIR=/tmp/tc50
  placements_bench "services colocated" --modes ar --concurrency 1,8 --repeats 2 || exit 3
  mark done
  ;;
49)
  bash scripts/gpu/lease_serving.sh 48 && bash scripts/gpu/lease_serving.sh 46
  ;;
48)
  [ -f $T/config.json ] || stage_target
  mark "bench in process"
  bench_inprocess ar,tree 16 "$OUT/report_inprocess.json"
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | tail -1 | cut -c1-300
  (cd "$OUT" && gzip report_inprocess.json)
  mark done
  ;;
46)
  [ -f $T/config.json ] || stage_target
  placements_bench "colocated services" --modes ar,tree,auto --budgets 16 --concurrency 1,8 \
    || exit 3
  mark done
  ;;
45)
  [ -f $T/config.json ] || stage_target
  mark check_kernels
  timeout 150 python3 scripts/gpu/check_kernels.py --no-bench 2>&1 | tail -4
  for tiles in 1 0 1; do
    mark "bench in process, DDTREE_ROW_TILES=$tiles"
    modes=tree; [ $tiles = 1 ] && [ ! -f "$OUT/report_rows1.json" ] && modes=ar,tree
    DDTREE_ROW_TILES=$tiles bench_inprocess $modes 16,32 \
      "$OUT/report_rows$tiles$( [ -f "$OUT/report_rows$tiles.json" ] && echo b).json"
  done
  for report in "$OUT"/report_rows*.json; do
    echo "$(basename $report): $(python3 scripts/gpu/ar_mismatches.py $report | tail -1 | cut -c1-200)"
  done
  (cd "$OUT" && tar -czf raw.tar.gz report*.json && rm -f report*.json)
  mark done
  ;;
44)
  mark gemm_rows_sweep
  timeout 400 python3 scripts/gpu/gemm_rows_sweep.py --json-out "$OUT/gemm_rows_sweep.json" \
    2>&1 | grep -v Warn
  mark done
  ;;
41)
  [ -f $T/config.json ] || stage_target
  mark check_kernels
  timeout 150 python3 scripts/gpu/check_kernels.py --no-bench 2>&1 | tail -4
  mark engine_bench exact, speed, profile
  timeout 330 python3 scripts/gpu/engine_bench.py --stages exact,speed,profile \
    --speed-modes ar,tree@16,tree@32 --speed-variants "plain,every split" --target $T \
    --humaneval $H 2>&1 | grep -v Warn | grep -v " c[18]: =6/6" \
    | grep -v "^ *Loading\|warnings.warn" | tail -22
  (cd "$OUT" && tar -czf raw.tar.gz engine_*.json profile_kernels.txt && rm -f engine_*.json)
  mark done
  ;;
42)
  [ -f $T/config.json ] || stage_target
  mark check_kernels
  timeout 150 python3 scripts/gpu/check_kernels.py --no-bench 2>&1 | tail -4
  for grid in 512 2048 1073741824; do
    mark "bench in process, DDTREE_SPLIT_PROGRAMS=$grid"
    modes=ar,tree; budgets=16,32; [ $grid = 512 ] || { modes=tree; budgets=32; }
    DDTREE_SPLIT_PROGRAMS=$grid bench_inprocess $modes $budgets \
      "$OUT/report_inprocess_$grid.json"
  done
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess_512.json" | cut -c1-600 | tail -2
  (cd "$OUT" && tar -czf raw.tar.gz report*.json && rm -f report*.json)
  mark done
  ;;
43)
  [ -f $T/config.json ] || stage_target
  BUDGETS=16,32 SERVE_BENCH_TIMEOUT=400 serve_against_ar || exit 3
  (cd "$OUT" && tar -czf raw.tar.gz report.json serve.log && rm -f report.json serve.log)
  mark done
  ;;
40)
  [ -f $T/config.json ] || stage_target
  for shared in "" --no-shared-stream; do
    mark "profile_ttft $shared"
    timeout 250 python3 scripts/profile_ttft.py --target $T --device cuda --dtype bfloat16 \
      --load 0,7 $shared 2>&1 | tail -4
  done
  mark done
  ;;
39)
  [ -f $T/config.json ] || stage_target
  python3 -m gateway --verifier-addr 127.0.0.1:50051 --target $T --port 8000 \
    >"$OUT/gateway.log" 2>&1 &
  G=$!
  for gil in 0.005 0.0005 0.005 0.0005; do
    mark "verifier, GIL switch interval $gil s"
    DDTREE_GIL_SWITCH_INTERVAL_S=$gil python3 -m verifier_svc --target $T --device cuda \
      --dtype bfloat16 --mode ar --port 50051 >>"$OUT/verifier.log" 2>&1 &
    V=$!
    wait_healthy $V "$OUT/verifier.log" || exit 3
    timeout 100 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
      --num-prompts 40 --num-requests 40 --modes ar --concurrency 8,1 --max-tokens 256 \
      --no-progress 2>&1 | grep "url "
    kill $V; wait $V 2>/dev/null
  done
  kill $G
  (cd "$OUT" && tar -czf raw.tar.gz verifier.log gateway.log && rm -f verifier.log gateway.log)
  mark done
  ;;
38)
  [ -f $T/config.json ] || stage_target
  mark bench in process
  timeout 200 python3 -m ddtree.cli bench --target $T --drafter $D --prompts humaneval \
    --num-prompts 40 --num-requests 40 --modes ar,tree --budgets 16,32 --concurrency 1,8 \
    --max-tokens 256 --no-progress --json-out "$OUT/report_inprocess.json" 2>&1 | tail -8
  mark serve
  start_serve || exit 3
  mark healthy
  timeout 300 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
    --num-prompts 40 --num-requests 40 --modes ar,tree,auto --budgets 16,32 \
    --concurrency 1,8 --max-tokens 256 --no-progress --json-out "$OUT/report.json" 2>&1 \
    | tail -10
  python3 scripts/gpu/ar_mismatches.py "$OUT/report.json" | cut -c1-600 | tail -4
  python3 scripts/gpu/ar_mismatches.py "$OUT/report_inprocess.json" | cut -c1-600 | tail -2
  kill $S; wait $S 2>/dev/null
  echo "drafter lost / fallbacks: $(grep -c 'drafter_lost\|fallback' "$OUT/serve.log")"
  (cd "$OUT" && tar -czf raw.tar.gz report*.json serve.log && rm -f report*.json serve.log)
  mark done
  ;;
36)
  [ -f $T/config.json ] || stage_target
  serve_against_ar || exit 3
  (cd "$OUT" && tar -czf raw.tar.gz report.json serve.log && rm -f report.json serve.log)
  mark done
  ;;
35)
  [ -f $T/config.json ] || stage_target
  mark serve
  mkdir -p "$OUT/pids"
  python3 -m ddtree.cli serve --target $T --drafter $D --port 8000 --device cuda \
    --dtype bfloat16 --pid-dir "$OUT/pids" >"$OUT/serve.log" 2>&1 &
  S=$!
  wait_healthy $S "$OUT/serve.log" || exit 3
  python3 -m gateway --verifier-addr 127.0.0.1:50051 --target $T --port 8001 \
    --no-shared-stream >"$OUT/gateway2.log" 2>&1 &
  G2=$!
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8001/health >/dev/null && break; sleep 0.5; done
  mark healthy
  bench_point 8000 ar 1 warm-up >/dev/null
  for pass in 1 2; do
    for point in "ar 8" "tree 8" "ar 1" "tree 1"; do
      set -- $point
      [ $pass = 2 ] && [ $2 = 1 ] && continue
      for port in 8000 8001; do
        mark "pass $pass $1 c$2 port $port"
        bench_point $port $1 $2 "$1-c$2-$port-p$pass"
      done
    done
  done
  mark samples against ar
  for port in 8000 8001; do
    python3 - "$OUT" "$port" <<'PY'
import glob, json, sys
out, port = sys.argv[1:]
rows = []
for path in sorted(glob.glob(f"{out}/report_*-{port}-p*.json")):
    rows += json.load(open(path))["rows"]
json.dump({"rows": rows}, open(f"{out}/all_{port}.json", "w"))
PY
    echo "port $port: $(python3 scripts/gpu/ar_mismatches.py "$OUT/all_$port.json" | tail -1 | cut -c1-300)"
  done
  kill $G2 $S; wait $S 2>/dev/null
  echo "drafter lost / fallbacks: $(grep -c 'drafter_lost\|fallback' "$OUT/serve.log")"
  (cd "$OUT" && tar -czf raw.tar.gz report_*.json bench_*.txt serve.log gateway2.log \
    && rm -f report_*.json bench_*.txt serve.log gateway2.log all_*.json)
  mark done
  ;;
34)
  [ -f $T/config.json ] || stage_target
  mark engine_bench exact, speed
  timeout 200 python3 scripts/gpu/engine_bench.py --stages exact,speed \
    --speed-modes tree@16,tree@32,tree@64 --speed-variants plain --target $T --humaneval $H \
    2>&1 | grep -v Warn | grep -v " c[18]: =6/6" | grep -v "^ *Loading\|warnings.warn" | tail -12
  for grouped in 1 0; do
    mark shapes8b grouped=$grouped
    DDTREE_GROUPED_ATTENTION=$grouped timeout 60 python3 scripts/gpu/engine_bench.py \
      --stages shapes8b --target $T --humaneval $H 2>&1 | grep "^8B"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_grouped$grouped.json"
  done
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json && rm -f engine_*.json)
  mark done
  ;;
33|37)
  [ -f $T/config.json ] || stage_target
  timeout 280 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | tail -20
  ;;
32)
  [ -f $T/config.json ] || stage_target
  mark engine_bench shapes8b, speed, exact
  timeout 300 python3 scripts/gpu/engine_bench.py --stages shapes8b,speed,exact \
    --speed-modes linear,tree@16,tree@32,tree@64,shadow@16 --speed-variants plain \
    --target $T --humaneval $H 2>&1 | grep -v Warn | grep -v " c[18]: =6/6" \
    | grep -v "^ *Loading\|warnings.warn" | tail -16
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json && rm -f engine_*.json)
  serve_against_ar || exit 3
  mark done
  ;;
31)
  mark 8B shapes and trace
  OUT=/tmp/traces31 timeout 200 python3 scripts/gpu/engine_bench.py --stages shapes8b,profile8b \
    --target /nonexistent --humaneval /nonexistent 2>&1 | grep -v Warn | grep "^8B\|floor\|== stage"
  for f in /tmp/traces31/trace*.json; do
    python3 scripts/trace_summary.py "$f" --kernels 40
  done > "$OUT/trace_summaries.txt" 2>&1
  (cd /tmp/traces31 && tar -czf "$OUT/traces.tar.gz" trace*.json && cp engine_*.json "$OUT/")
  mark done
  ;;
30)
  [ -f $T/config.json ] || stage_target
  mark remote profile with traces
  mkdir -p /tmp/traces30
  remote_profile --rows 1,8 --rounds 40 --trace-dir /tmp/traces30 > "$OUT/remote_profile.txt" 2>&1
  grep -A4 "^per-round" "$OUT/remote_profile.txt"
  grep -c "drafter_lost" "$OUT/remote_profile.txt"
  for f in /tmp/traces30/trace*.json; do
    python3 scripts/trace_summary.py "$f" --steps 4 --kernels 30
  done > "$OUT/trace_summaries.txt" 2>&1
  grep "^median\|: .* steps" "$OUT/trace_summaries.txt"
  (cd /tmp/traces30 && tar -czf "$OUT/traces.tar.gz" trace*.json)
  mark engine_bench exact, speed, shapes8b
  timeout 330 python3 scripts/gpu/engine_bench.py --stages exact,speed,shapes8b \
    --speed-modes linear,tree@16,tree@32 --speed-variants plain --target $T --humaneval $H 2>&1 \
    | grep -v Warn | grep -v " c[18]: =6/6" | grep -v "^ *Loading" | tail -24
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json && rm -f engine_*.json)
  mark done
  ;;
28)
  [ -f $T/config.json ] || stage_target
  mark remote profile with traces
  mkdir -p /tmp/traces
  remote_profile --rows 1,8 --rounds 40 --cprofile --cprofile-top 30 --trace-dir /tmp/traces \
    > "$OUT/remote_profile.txt" 2>&1
  grep -A4 "^per-round" "$OUT/remote_profile.txt"
  mark 8B shapes and trace
  OUT=/tmp/traces timeout 200 python3 scripts/gpu/engine_bench.py --stages shapes8b,profile8b \
    --target $T --humaneval $H 2>&1 | grep -v Warn | grep "^8B\|floor\|== stage"
  mark summaries
  for f in /tmp/traces/trace*.json; do
    python3 scripts/trace_summary.py "$f" --steps 3 --kernels 30
  done > "$OUT/trace_summaries.txt" 2>&1
  grep -B2 -A12 "^trace_rows1" "$OUT/trace_summaries.txt" | head -40
  grep "^median\|: .* steps" "$OUT/trace_summaries.txt"
  (cd /tmp/traces && tar -czf "$OUT/traces.tar.gz" trace*.json && cp profile8b_kernels.txt engine_*.json "$OUT/")
  mark done
  ;;
29)
  mark gemm sweep
  timeout 420 python3 scripts/gpu/gemm_sweep.py --seconds-per-shape 50 \
    --json-out "$OUT/gemm_sweep.json" 2>&1 | grep -v Warn
  mark done
  ;;
27)
  [ -f $T/config.json ] || stage_target
  serve_against_ar || exit 3
  mark done
  ;;
26)
  [ -f $T/config.json ] || stage_target
  start_serve || exit 3
  for pass in 1 2; do
    mark bench url pass $pass
    timeout 200 python3 -m ddtree.cli bench --url http://127.0.0.1:8000 --prompts humaneval \
      --num-prompts 40 --num-requests 40 --modes ar,auto --concurrency 1 --max-tokens 256 \
      --no-progress --json-out "$OUT/report$pass.json" 2>&1 | tail -3
    python3 scripts/gpu/ar_mismatches.py "$OUT/report$pass.json" | cut -c1-600 | tail -6
  done
  kill $S; wait $S 2>/dev/null
  grep -c "drafter_lost\|fallback" "$OUT/serve.log"
  mark done
  ;;
25)
  [ -f $T/config.json ] || stage_target
  mark autoseq, exact
  timeout 200 python3 scripts/gpu/engine_bench.py --stages autoseq,exact --target $T \
    --drafter $D --humaneval $H 2>&1 | grep -v Warn | grep -v "^ *Loading" | cut -c1-300 \
    | grep -v " c[18]: =6/6" | tail -30
  mark load curves
  timeout 150 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep "auto\|ar c\|stage" | tail -18
  mark bench in process
  MODES=ar,tree,auto REPEATS=1 load_bench --target $T --drafter $D 2>&1 \
    | tee "$OUT/bench_inprocess.txt" | tail -7
  MODES=ar,tree,auto REPEATS=1 serve_bench || exit 3
  (cd "$OUT" && tar -cf services.tar serve*.log metrics*.txt engine_*.json \
    && rm -f serve*.log metrics*.txt engine_*.json)
  mark done
  ;;
24)
  [ -f $T/config.json ] || stage_target
  mark autoseq
  timeout 120 python3 scripts/gpu/engine_bench.py --stages autoseq --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | grep -v "^ *Loading" | cut -c1-400 | tail -26
  mark bench in process
  MODES=auto REPEATS=1 load_bench --target $T --drafter $D 2>&1 \
    | tee "$OUT/bench_inprocess.txt" | tail -3
  MODES=ar,auto REPEATS=1 serve_bench || exit 3
  (cd "$OUT" && tar -cf services.tar serve*.log metrics*.txt && rm -f serve*.log metrics*.txt)
  mark done
  ;;
23)
  stage_target
  mark load curves
  timeout 240 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | grep -v "^ *Loading" | tail -34
  mark bench in process
  MODES=ar,tree,auto REPEATS=1 load_bench --target $T --drafter $D 2>&1 \
    | tee "$OUT/bench_inprocess.txt" | tail -9
  MODES=ar,tree,auto REPEATS=1 serve_bench || exit 3
  (cd "$OUT" && tar -cf services.tar serve*.log metrics*.txt && rm -f serve*.log metrics*.txt)
  mark done
  ;;
0)  # carry .whl alone (lease 11: the 39 MB repository + a quarter + the wheels passed 64 MiB;
  # lease 14: the repository + a quarter is ~62.8 MiB, so raw results go in trimmed: reports
  # without their samples, logs gzipped)
  ls /tmp/site | head -3
  if [ -d .carry/spec ]; then mkdir -p /tmp/spec_bench && cp .carry/spec/*.jsonl /tmp/spec_bench/; fi
  if [ -d .carry/g0 ]; then cp .carry/g0/part0 /tmp/; fi
  ;;
1|2|3|g3b|g3c|g3d|g3e)
  cp .carry/g${1#g}/part* /tmp/
  # the spec-bench JSONL ride with call 3 since lease 40 (call 0 with them passed 64 MiB)
  if [ -d .carry/spec ]; then mkdir -p /tmp/spec_bench && cp .carry/spec/*.jsonl /tmp/spec_bench/; fi
  if [ "$1" = 1 ]; then
    cp .carry/g1/HumanEval.jsonl.gz /tmp/
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
  fi
  ;;
4)
  stage_target
  mark engine_bench
  timeout 250 python3 scripts/gpu/engine_bench.py --stages exact,speed,profile --target $T \
    --humaneval $H 2>&1 | tee "$OUT/engine.txt" | grep -v " c[18]: =6/6"
  tar -C "$OUT" -cf "$OUT/engine_json.tar" $(cd "$OUT" && ls engine_*.json) && rm -f "$OUT"/engine_*.json
  mark bench in process
  load_bench --target $T --drafter $D 2>&1 | tee "$OUT/bench_inprocess.txt" | tail -7
  mark serve
  serve_bench || exit 3
  mark done
  ;;
5)
  if [ -z "${SOAK:-}" ]; then
    INIT_FROM=${INIT_FROM:-$D} DATA_IN=${DATA_IN:-.carry/drafter-data} LR=${LR:-4e-4} \
      TOTAL_SECONDS=${TOTAL_SECONDS:-540} timeout 585 bash scripts/gpu/lease_drafter.sh train 2>&1 | tail -40
    exit
  fi
  mkdir -p /tmp/soak
  setsid python3 scripts/soak.py --start --target $T --drafter $D --device cuda \
    --dtype bfloat16 --concurrency 64 --duration-s 600 --kill-drafter-every-s 60 \
    --max-tokens 128 --json-out /tmp/soak/report.json >/tmp/soak/log.txt 2>&1 < /dev/null &
  sleep 5
  TOTAL_SECONDS=530 timeout 575 bash scripts/gpu/lease_drafter.sh train 2>&1 | tail -40
  tail -3 /tmp/soak/log.txt
  ;;
8)
  # carry .carry/g4 on a machine staged by calls 1-3: the policy with measured costs (every
  # mode against ar, `auto` included; the concurrency curves with `auto`)
  stage_target
  mark engine_bench exact,load
  timeout 300 python3 scripts/gpu/engine_bench.py --stages exact,load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | tail -40
  mark done
  ;;
9)
  stage_target
  mark engine_bench speed
  timeout 200 python3 scripts/gpu/engine_bench.py --stages speed --speed-modes linear,tree@32 \
    --speed-variants "plain,generic ar" --target $T --humaneval $H 2>&1 | grep -v Warn | tail -8
  mark remote profile, GIL switch 5 ms
  remote_profile 2>&1 | tee "$OUT/remote_profile.txt" | tail -4
  mark remote profile, GIL switch 0.5 ms
  DDTREE_GIL_SWITCH_INTERVAL_S=0.0005 remote_profile 2>&1 | tee -a "$OUT/remote_profile.txt" | tail -4
  REPEATS=1 serve_bench || exit 3
  DDTREE_GIL_SWITCH_INTERVAL_S=0.0005 REPEATS=1 serve_bench _gil05 || exit 3
  mark done
  ;;
10)
  # call 9's remote profile again, and `ddtree serve` at a shorter switch interval
  mark remote profile, GIL switch 5 ms
  remote_profile 2>&1 | tee "$OUT/remote_profile.txt" | tail -4
  mark remote profile, GIL switch 0.5 ms
  DDTREE_GIL_SWITCH_INTERVAL_S=0.0005 remote_profile 2>&1 | tee -a "$OUT/remote_profile.txt" | tail -4
  DDTREE_GIL_SWITCH_INTERVAL_S=${GIL:-0.0002} REPEATS=1 serve_bench _gil || exit 3
  mark done
  ;;
11)
  # (after 1-3, carry .carry/g4) the alternating halves: the remote profile with and
  # without, tree@32 through `ddtree serve` with and without (twice each, interleaved),
  # then the load curves (ar's short round, the policy's fixes since lease 5)
  stage_target
  mark remote profile
  remote_profile --alternate both 2>&1 | tee "$OUT/remote_profile.txt" | tail -7
  for pass in 1 2; do
    MODES=tree REPEATS=1 serve_bench _on$pass || exit 3
    DDTREE_ALTERNATE=0 MODES=tree REPEATS=1 serve_bench _off$pass || exit 3
  done
  mark load curves
  timeout 150 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | tail -18
  (cd "$OUT" && tar -cf services.tar serve_*.log metrics_*.txt && rm -f serve_*.log metrics_*.txt)
  mark done
  ;;
12)
  # (after 1-3, carry .carry/g4) the SwiGLU epilogue (bitwise on the GPU, the speed table
  # with and without it, ar's short round), every mode against ar (bf16), the load curves
  # (the policy measuring at the rows' context), continuous load in process and through
  # `ddtree serve`
  stage_target
  mark epilogue bitwise
  python3 - <<'PY' 2>&1 | tail -4
import torch
from ddtree.kernels.fused_linear import linear_swiglu
from ddtree.kernels.matmul import invariant_linear
from ddtree.kernels.swiglu import silu_mul
torch.manual_seed(0)
for two_i, k in ((3072, 576), (24576, 4096)):
    w = (torch.randn(two_i, k, device="cuda") / 30).bfloat16()
    for t in (1, 33, 264, 2048):
        x = torch.randn(t, k, device="cuda").bfloat16()
        same = torch.equal(linear_swiglu(x, w), silu_mul(invariant_linear(x, w)))
        print(f"epilogue {two_i}x{k} T={t}: bitwise {same}")
PY
  mark engine_bench speed, exact
  timeout 330 python3 scripts/gpu/engine_bench.py --stages speed,exact --speed-modes linear,tree@32 \
    --speed-variants "plain,generic ar,no epilogue" --target $T --humaneval $H 2>&1 \
    | grep -v Warn | grep -v " c[18]: =6/6" | tail -14
  curves_and_serving || exit 3
  mark done
  ;;
14)
  stage_target
  mark engine_bench speed, exact
  timeout 300 python3 scripts/gpu/engine_bench.py --stages speed,exact --speed-modes linear,tree@32 \
    --speed-variants "plain,no PDL" --target $T --humaneval $H 2>&1 \
    | grep -v Warn | grep -v " c[18]: =6/6" | tail -14
  curves_and_serving || exit 3
  mark profile
  timeout 100 python3 scripts/gpu/engine_bench.py --stages profile --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | tail -12
  (cd "$OUT" && ls && tar -cf engine_json.tar $(ls engine_*.json profile*.txt 2>/dev/null) && rm -f engine_*.json profile*.txt)
  mark done
  ;;
15)
  stage_target
  mark engine_bench speed: PDL, no PDL, no prefetch
  timeout 150 python3 scripts/gpu/engine_bench.py --stages speed --speed-modes linear,tree@32 \
    --speed-variants "plain,no PDL,no prefetch" --target $T --humaneval $H 2>&1 \
    | grep -v Warn | tail -9
  mv "$OUT/engine_speed.json" "$OUT/engine_speed_before_tuning.json"
  mark tune the demo shapes
  cp ddtree/kernels/linear_tuned.json "$OUT/linear_tuned_before.json"
  timeout 150 python3 scripts/gpu/tune_linear.py --shapes smollm2,drafter --seconds-per-shape 10 2>&1 | tail -9
  cp ddtree/kernels/linear_tuned.json "$OUT/linear_tuned.json"
  mark engine_bench speed, exact with the new table
  timeout 150 python3 scripts/gpu/engine_bench.py --stages speed,exact --speed-modes linear,tree@32 \
    --speed-variants plain --target $T --humaneval $H 2>&1 | grep -v Warn | grep -v " c[18]: =6/6" | tail -6
  curves_and_serving || exit 3
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json linear_tuned*.json && rm -f engine_*.json linear_tuned*.json)
  mark done
  ;;
16)
  stage_target
  mark shapes8b, PDL
  timeout 200 python3 scripts/gpu/engine_bench.py --stages shapes8b --target $T --humaneval $H 2>&1 \
    | grep -v Warn | tail -12
  mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_pdl.json"
  mark shapes8b, no PDL
  DDTREE_PDL=0 timeout 200 python3 scripts/gpu/engine_bench.py --stages shapes8b --target $T \
    --humaneval $H 2>&1 | grep -v Warn | tail -12
  mark profile
  timeout 100 python3 scripts/gpu/engine_bench.py --stages profile --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | grep "^profile"
  mark remote profile
  remote_profile 2>&1 | tee "$OUT/remote_profile.txt" | tail -5
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json profile*.txt && rm -f engine_*.json profile*.txt)
  mark done
  ;;
17)
  stage_target
  for variant in pdl noprefetch nopdl; do
    mark shapes8b $variant
    case $variant in
      pdl) envs="" ;; noprefetch) envs="DDTREE_PDL_PREFETCH=0" ;; nopdl) envs="DDTREE_PDL=0" ;;
    esac
    env $envs timeout 100 python3 scripts/gpu/engine_bench.py --stages shapes8b --target $T \
      --humaneval $H 2>&1 | grep -v Warn | grep "^8B"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_$variant.json"
  done
  mark engine_bench speed
  timeout 150 python3 scripts/gpu/engine_bench.py --stages speed,exact --speed-modes linear,tree@32 \
    --speed-variants "plain,no PDL,no prefetch" --target $T --humaneval $H 2>&1 \
    | grep -v Warn | grep -v " c[18]: =6/6" | grep -v "^ *Loading" | tail -10
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json && rm -f engine_*.json)
  mark done
  ;;
18)
  stage_target
  for variant in pdl nopdl; do
    mark shapes8b $variant
    [ $variant = nopdl ] && envs="DDTREE_PDL=0" || envs=""
    env $envs timeout 100 python3 scripts/gpu/engine_bench.py --stages shapes8b --target $T \
      --humaneval $H 2>&1 | grep -v Warn | grep "^8B"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_$variant.json"
  done
  mark engine_bench speed, exact
  timeout 150 python3 scripts/gpu/engine_bench.py --stages speed,exact --speed-modes linear,tree@32 \
    --speed-variants "plain,no PDL" --target $T --humaneval $H 2>&1 \
    | grep -v Warn | grep -v " c[18]: =6/6" | grep -v "^ *Loading" | tail -9
  curves_and_serving || exit 3
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json && rm -f engine_*.json)
  mark done
  ;;
20)
  stage_target
  mark engine_bench speed, exact
  timeout 200 python3 scripts/gpu/engine_bench.py --stages speed,exact \
    --speed-modes linear,tree@16,tree@32,tree@64,shadow@16 --speed-variants "plain,PyTorch tree" \
    --target $T --humaneval $H 2>&1 | grep -v Warn | grep -v " c[18]: =6/6" \
    | grep -v "^ *Loading" | tail -14
  mark profile
  timeout 90 python3 scripts/gpu/engine_bench.py --stages profile --target $T --humaneval $H \
    2>&1 | grep -v Warn | grep -v "^ *Loading" | tail -12
  curves_and_serving || exit 3
  (cd "$OUT" && tar -cf engine_json.tar engine_*.json && rm -f engine_*.json)
  mark done
  ;;
22)
  stage_target
  python3 - <<'PY'
import json
table = json.load(open("ddtree/kernels/linear_tuned.json"))
json.dump({k: v for k, v in table.items() if "4096" not in k}, open("/tmp/table_default8b.json", "w"))
json.dump({**table, "6144x4096:bfloat16": {**table["6144x4096:bfloat16"], "split_k": 4}},
          open("/tmp/table_qkvsplit4.json", "w"))
json.dump(table, open("/tmp/table_committed.json", "w"))
PY
  for table in committed default8b qkvsplit4 committed; do
    mark shapes8b $table
    timeout 100 python3 scripts/gpu/engine_bench.py --stages shapes8b --linear-table /tmp/table_$table.json \
      --target $T --humaneval $H 2>&1 | grep -v Warn | grep "^8B"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_${table}_$(date +%s).json"
  done
  REPEATS=1 serve_bench || exit 3
  grep -c drafter_lost "$OUT/serve.log"
  (cd "$OUT" && tar -cf services.tar serve*.log metrics*.txt && rm -f serve*.log metrics*.txt)
  mark done
  ;;
21)
  stage_target
  for pass in 1 2; do
    GATEWAY_WORKERS=2 REPEATS=1 serve_bench _workers2_$pass || exit 3
    GATEWAY_WORKERS=1 REPEATS=1 serve_bench _workers1_$pass || exit 3
  done
  (cd "$OUT" && tar -cf services.tar serve*.log metrics*.txt && rm -f serve*.log metrics*.txt)
  mark load curves
  timeout 150 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | grep auto
  for epilogue in epilogue no-epilogue; do
    mark shapes8b $epilogue
    timeout 100 python3 scripts/gpu/engine_bench.py --stages shapes8b --$epilogue --target $T \
      --humaneval $H 2>&1 | grep -v Warn | grep "^8B"
    mv "$OUT/engine_shapes8b.json" "$OUT/engine_shapes8b_$epilogue.json"
  done
  mark done
  ;;
19)
  stage_target
  for pass in 1 2; do
    REPEATS=1 serve_bench _merge$pass || exit 3
    DDTREE_MERGE_WHEN_BEHIND=0 REPEATS=1 serve_bench _nomerge$pass || exit 3
  done
  (cd "$OUT" && tar -cf services.tar serve*.log metrics*.txt && rm -f serve*.log metrics*.txt)
  mark done
  ;;
7)
  # The committed drafter's table (same stage, to compare), the continuous-load benches of
  # call 4 again (after a change between calls), then the engine's concurrency curves.
  mark table, committed drafter
  mkdir -p "$OUT/old" && OUT="$OUT/old" DRAFTER=$D timeout 150 bash scripts/gpu/lease_drafter.sh table 2>&1 | tail -16
  mark bench in process
  load_bench --target $T --drafter $D 2>&1 | tee "$OUT/bench_inprocess.txt" | tail -7
  serve_bench || exit 3
  mark load curves
  timeout 110 python3 scripts/gpu/engine_bench.py --stages load --target $T --drafter $D \
    --humaneval $H 2>&1 | grep -v Warn | tail -18
  mark done
  ;;
6)
  mark table
  timeout 250 bash scripts/gpu/lease_drafter.sh table 2>&1 | tail -30  # while a soak ends
  if [ -z "${SOAK:-}" ]; then
    mark speed, new drafter
    mkdir -p "$OUT/new" && OUT="$OUT/new" timeout 200 python3 scripts/gpu/engine_bench.py \
      --stages speed --target $T --drafter /tmp/ddtree-drafter-new --humaneval $H 2>&1 | tail -16
    mark load curves
    OUT="$OUT/new" timeout 110 python3 scripts/gpu/engine_bench.py --stages load --target $T \
      --drafter $D --humaneval $H 2>&1 | grep -v Warn | tail -18
    mark done
    exit
  fi
  for _ in $(seq 1 800); do [ -s /tmp/soak/report.json ] && break; sleep 1; done
  cp /tmp/soak/report.json "$OUT/soak_report.json"; tail -c 20000 /tmp/soak/log.txt > "$OUT/soak_log.txt"
  cat "$OUT/soak_report.json"
  ;;
esac
