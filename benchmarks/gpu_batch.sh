#!/usr/bin/env bash
# One batch of `ft bench` runs on the lent GPU host (../shared/device/README.md protocol: budgets
# and threads of consumer machines), for BENCHMARKS.md. Each run is capped so the batch fits one
# device call; results go to $OUT (JSON + stderr), a summary line per run to stdout.
#
#   device: carry [".whl", ".traces"]; command: bash benchmarks/gpu_batch.sh [quick|full]
#   (.traces/ holds a copy of ../shared/traces/bigmoeonedge/qwen3-30b-a3b.npz)
set -u
WHAT=${1:-quick}
OUT=${OUT:-./bench-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl 2>/dev/null
fi
export PYTHONPATH=$PWD/.site:$PWD FT_HOME=${FT_HOME:-$PWD/.fthome}
TRACE=${TRACE:-.traces/qwen3-30b-a3b.npz}
ALL=auto,offload,cpu,static,prefill_placement

run() {  # name, seconds, ft bench arguments...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m ftpull bench --device cuda --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$?"
  python3 -c 'from runtime.bench.report import main; main()' "$OUT/$name.json" 2>/dev/null || tail -3 "$OUT/$name.err"
}

run q30-8g-trace 150 --shape qwen3-30b-a3b --budget-gib 8 --threads 6 --routing trace --trace "$TRACE" \
    --tokens 96 --prefill '' --policies $ALL --reps 2 --profile-tokens 4
run q30-32g-trace 150 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --routing trace --trace "$TRACE" \
    --tokens 96 --prefill '' --policies $ALL --reps 2 --profile-tokens 4
run q30-32g-trace-graphs 150 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --routing trace --trace "$TRACE" \
    --tokens 96 --prefill '' --policies offload,auto --cuda-graphs
if [ "$WHAT" = full ]; then
  run q30-8g-synth 150 --shape qwen3-30b-a3b --budget-gib 8 --threads 6 --tokens 64 --prefill 1024,4096,16384 \
      --policies $ALL
  run q30-32g-synth 150 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --tokens 64 --prefill '' --policies $ALL
  run q36-8g-synth 150 --shape qwen3.6-35b-a3b --budget-gib 8 --threads 6 --tokens 64 --prefill '' --policies $ALL
  run glm-air-32g-synth 150 --shape glm-4.5-air --budget-gib 32 --threads 8 --layers 23 --tokens 64 --prefill '' \
      --policies $ALL
fi
