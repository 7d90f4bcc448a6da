#!/usr/bin/env bash
# One batch of `ft bench` runs on the lent GPU host (../shared/device/README.md protocol: budgets
# and threads of consumer machines), for docs/benchmark-history.md. Each run is capped so the batch fits one
# device call; results go to $OUT (JSON + stderr), a summary line per run to stdout.
#
#   device: carry [".whl", ".traces"]; command: bash benchmarks/gpu_batch.sh [tests|quick|more|profile|pdl|queue]
#   (.traces/ holds a copy of ../shared/traces/bigmoeonedge/qwen3-30b-a3b.npz)
#   tests: the GPU tests, `ft run tiny --device gpu` and a whole model's decode (~3 min); quick: the CUDA-graph parity
#   tests, `ft run tiny` on GPU and CPU, and the trace runs at 8 and 32 GiB in 3 rounds, and at 8
#   GiB over an emulated x8 link (~7 min; SHAPES=1 adds Qwen3.6 and GLM-4.5-Air, ~9 min); more:
#   synthetic routing, prefill, and the Qwen3.6 and full-depth GLM-4.5-Air shapes (~9 min); pdl:
#   programmatic dependent launch on and off (FT_PDL=0), side by side, for the whole model's decode
#   and the 32 GiB trace run (~6 min); queue: decode steps queued ahead (the default) against
#   launched after the wait (--no-queue-ahead), for the whole model's decode and the 32 GiB trace
#   run (~6 min). Each fits one device call.
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

if [ "$WHAT" = tests ]; then
  timeout 300 python3 -m pytest -m gpu -p no:cacheprovider --continue-on-collection-errors -v tests/ > "$OUT/gpu-tests.txt" 2>&1
  echo "gpu tests rc=$?"; grep -E "PASSED|FAILED|ERROR|XFAIL|XPASS" "$OUT/gpu-tests.txt" | tail -40
  python3 -m ftpull pull tiny > /dev/null && timeout 120 python3 -m ftpull run tiny "Hello" --device gpu --verbose \
      --num-predict 16 > "$OUT/run-gpu.txt" 2>&1
  echo "ft run --device gpu rc=$?"; tail -8 "$OUT/run-gpu.txt"
  # a whole Qwen3-30B-shaped model: eager, a graph per expert call, a graph per step
  timeout 200 python3 benchmarks/bench_model_decode.py --layers 48 --experts 32 --tokens 64 > "$OUT/model-decode.txt" 2>&1
  echo "bench_model_decode rc=$?"; tail -4 "$OUT/model-decode.txt"
  exit 0
fi

if [ "$WHAT" = pdl ]; then  # PDL (whole-step graphs) against none: whole model, then experts only at 32 GiB
  for round in 1-on 2-off 3-on; do
    pdl=1; [ "${round#*-}" = off ] && pdl=0
    FT_PDL=$pdl timeout 100 python3 benchmarks/bench_model_decode.py --layers 48 --experts 32 --tokens 64 \
        > "$OUT/model-$round.txt" 2>&1
    echo "bench_model_decode FT_PDL=$pdl rc=$?"; tail -3 "$OUT/model-$round.txt"
  done
  for round in 1-on 2-off 3-on; do
    pdl=1; [ "${round#*-}" = off ] && pdl=0
    FT_PDL=$pdl run q30-32g-pdl-$round 100 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --routing trace \
        --trace "$TRACE" --tokens 96 --prefill= --policies auto,offload --reps 3
  done
  exit 0
fi

if [ "$WHAT" = queue ]; then  # steps queued ahead against launched after the wait: whole model, then experts only
  timeout 200 python3 benchmarks/bench_model_decode.py --layers 48 --experts 32 --tokens 64 \
      --ways "step graphs,steps queued" > "$OUT/model-queue.txt" 2>&1
  echo "bench_model_decode rc=$?"; tail -2 "$OUT/model-queue.txt"
  for round in 1-on 2-off 3-on; do
    flag=--queue-ahead; [ "${round#*-}" = off ] && flag=--no-queue-ahead
    run q30-32g-queue-$round 110 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --routing trace \
        --trace "$TRACE" --tokens 96 --prefill= --policies auto,offload --reps 3 $flag
  done
  exit 0
fi

if [ "$WHAT" = profile ]; then  # where a 32 GiB decode step's time goes: host ops, and Chrome traces of the device
  timeout 90 python3 -m pytest -p no:cacheprovider -q tests/test_gpu_executor.py -k "graph or parity" > "$OUT/graph-tests.txt" 2>&1
  echo "graph tests rc=$?"; tail -3 "$OUT/graph-tests.txt"
  # a decode layer call split into host, device and wall; cProfile and the kernels' device time
  timeout 90 python3 benchmarks/bench_decode_layer.py 48 32 > "$OUT/decode-layer.txt" 2>&1
  echo "bench_decode_layer rc=$?"; head -6 "$OUT/decode-layer.txt"
  run q30-32g-trace-prof 240 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --routing trace --trace "$TRACE" \
      --tokens 96 --prefill '' --policies auto,offload --reps 3 --profile-tokens 8 --profile-dir "$OUT/prof"
  run q30-8g-trace-x8 200 --shape qwen3-30b-a3b --budget-gib 8 --threads 6 --routing trace --trace "$TRACE" \
      --tokens 96 --prefill '' --policies $ALL --reps 2 --pcie-repeat 2
  exit 0
fi

if [ "$WHAT" = more ]; then
  run q30-8g-synth 150 --shape qwen3-30b-a3b --budget-gib 8 --threads 6 --tokens 64 --prefill 1024,4096,16384 \
      --policies $ALL
  run q30-32g-synth 130 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --tokens 64 --prefill '' --policies $ALL
  run q36-8g-synth 130 --shape qwen3.6-35b-a3b --budget-gib 8 --threads 6 --tokens 64 --prefill '' --policies $ALL
  # all 46 MoE layers of GLM-4.5-Air (190 GiB of experts) in 66 GiB of host RAM: 16 banks shared
  run glm-air-32g-synth 150 --shape glm-4.5-air --budget-gib 32 --threads 8 --host-banks 16 --tokens 64 --prefill '' \
      --policies $ALL --reps 2
  exit 0
fi

# quick: the CUDA-graph parity tests, `ft run tiny` on the GPU against the CPU, then the trace
# runs (CUDA graphs on, the default) in 3 interleaved rounds; SHAPES=1 adds one run each of the
# Qwen3.6 and GLM-4.5-Air shapes
timeout 90 python3 -m pytest -p no:cacheprovider -q tests/test_gpu_executor.py -k "graph or parity" > "$OUT/graph-tests.txt" 2>&1
echo "graph tests rc=$?"; tail -3 "$OUT/graph-tests.txt"
python3 -m ftpull pull tiny > /dev/null
for d in gpu cpu; do
  timeout 60 python3 -m ftpull run tiny "Hello" --device $d --num-predict 24 --temperature 0 > "$OUT/run-$d.txt" 2>&1
  echo "ft run --device $d rc=$?: $(head -c 200 "$OUT/run-$d.txt")"
done
run q30-8g-trace 200 --shape qwen3-30b-a3b --budget-gib 8 --threads 6 --routing trace --trace "$TRACE" \
    --tokens 96 --prefill '' --policies $ALL --reps 3
run q30-32g-trace 200 --shape qwen3-30b-a3b --budget-gib 32 --threads 8 --routing trace --trace "$TRACE" \
    --tokens 96 --prefill '' --policies $ALL --reps 3
# a laptop (RTX 4060 class: 8 GiB, 6 threads, an x8 link): every PCIe copy made twice
run q30-8g-trace-x8 200 --shape qwen3-30b-a3b --budget-gib 8 --threads 6 --routing trace --trace "$TRACE" \
    --tokens 96 --prefill '' --policies $ALL --reps 3 --pcie-repeat 2
if [ "${SHAPES:-0}" = 1 ]; then
  run q36-8g-synth 75 --shape qwen3.6-35b-a3b --budget-gib 8 --threads 6 --tokens 48 --prefill '' --policies $ALL
  run glm-air-32g-synth 75 --shape glm-4.5-air --budget-gib 32 --threads 8 --layers 16 --tokens 48 --prefill '' \
      --policies $ALL
fi
