#!/usr/bin/env bash
# The llama.cpp race on the lent GPU host in device calls of under 10 minutes each
# (../shared/device/README.md; the machine goes back ~30 s after a call, so make the next call
# at once: what a call builds under /tmp stays for the next one only while the machine is held).
#
#   here:   mkdir -p .clean && git archive HEAD | gzip > .clean/ft.tar.gz
#   device: carry [".whl", ".lcpp", ".traces", ".clean"]; command: bash .clean/device_calls.sh CALL
#           (cp benchmarks/race/device_calls.sh .clean/ first: the script runs from the carried copy)
#
# CALL:
#   setup    unpack, build llama.cpp and pull the bf16 race file beside the GPU tests, then make
#            and pull the Q4_K_M file (~8 min); the logs and test results go to $OUT
#   race8    the 8-thread race, -ncmoe 16, 12, 8, pp512 + tg256 + trace routing (~5 min)
#   race6    the same at 6 threads (~5 min)
#   quant    the Q4_K_M file at -ncmoe 16 and 8, 8 threads, with every thread's stack every 30 s
#            should ft's side stall (~7 min)
#   long     pp4096 and pp16384 at -ncmoe 16, 6 and 8 threads (~8 min)
#   kernels  a cold machine's block-GEMV bench (against .clean/ftold.tar.gz's where carried) and GPU
#            kernel tests beside the build and pull, then the Q4_K_M race at -ncmoe 8 (~9 min)
#   profile  a cold machine's profiles of one decode token, Q4_K_M and bf16 (~8 min; no llama-bench)
#   tests    a cold machine's run of the $GPU_TESTS files on CUDA (all their tests: a kernel test file
#            marks none gpu, it runs at DEVICE=cuda there), then bench_grouped_experts.py for bf16,
#            FP8 and Q4_K_M records (~3-5 min)
#   replay   a cold machine's agent replay (benchmarks/agent_replay.py, issue 23) against `ft serve` on
#            the Q4_K_M race file at VRAM_GIB (4) with two sessions, through the real anthropic
#            client (carry .whl2 too: the anthropic, openai and ollama wheels and what the host lacks
#            of theirs, httpx2, httpcore2, h11, sniffio, truststore, distro, docstring_parser, jiter,
#            opentelemetry-api, which fastapi 0.165 imports too; ~7 min; no llama-bench)
#   cpuside  a cold machine's look at auto's CPU side (benchmarks/bench_profile.py: the bandwidth
#            profile's raw points at 4, 8 and 12 threads with the CPU facts, the kernel alone, the
#            hand-off with a CPU expert a layer; ~4 min, no model file)
#   handoff  a cold machine's bench_handoff.py (the CPU share's fixed cost a layer call, no model file)
#            with OpenMP's threads sleeping between calls as by default, and spinning
#            (OMP_WAIT_POLICY=active), side by side (~2 min)
#   prompts  a cold machine's profiles of a 512-token Q4_K_M prompt at -ncmoe 16's budget (also at
#            .clean/ftold.tar.gz's commit where carried; this commit's timeline too, p_q4_trace.json.gz)
#            and at 1 GiB, LAYERS=4 (~4 min; no llama-bench)
#   quick    a cold machine's one race: the build beside the bf16 pull (written only where QUANT is set; no GPU
#            tests; the host's CPU facts to cpu_facts.log), then the
#            8-thread race at $SETTINGS (default 8), of the $QUANT file where set (~7 min)
# Environment: FT_COMMIT (the commit the tarball is; recorded in the rows), FILL_PRICING (worth),
# SHAPE (qwen3-30b-a3b, or qwen3.6-35b-a3b: synth_gguf.py's shapes; trace routing for the first only),
# SETTINGS and QUANT (quick: e.g. SETTINGS=8 QUANT=Q4_K_M), GPU_TESTS (quick: test files run whole on
# CUDA first, beside the build and the pull).
set -u
CALL=${1:?setup, race8, race6, quant, long, quick, tests, kernels, profile, prompts, replay, handoff or cpuside}
OUT=${OUT:-/tmp/race-out}
mkdir -p "$OUT" /tmp/ft
if [ ! -f /tmp/ft/.unpacked ]; then
  tar xzf .clean/ft.tar.gz -C /tmp/ft && cp -r .whl .lcpp .traces /tmp/ft/ && touch /tmp/ft/.unpacked
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/ft/.whl/*.whl
fi
cd /tmp/ft || exit 1
export PYTHONPATH=/tmp/site:$PWD FT_COMMIT=${FT_COMMIT:-unknown}
SHAPE=${SHAPE:-qwen3-30b-a3b}  # benchmarks/race/synth_gguf.py SHAPES; the trace routes the default one only
TRACE=()
if [ "$SHAPE" = qwen3-30b-a3b ]; then TRACE=(--trace "$PWD/.traces/qwen3-30b-a3b.npz"); fi
RACE=(python3 benchmarks/vs_llamacpp.py race --shape "$SHAPE" --work /tmp/race --layers 16 "${TRACE[@]}")
PRICING=()
if [ -n "${FILL_PRICING:-}" ]; then PRICING=(--fill-pricing "$FILL_PRICING"); fi
start_build_and_pull() {  # llama.cpp's build and the bf16 race file's pull (${1:-pull}; gguf: written only), side by side: $build, $pulled
  (JOBS=14 bash .lcpp/build.sh /tmp/lcpp > "$OUT/lcpp.log" 2>&1; echo "build rc $?" >> "$OUT/lcpp.log") &
  build=$!
  (python3 benchmarks/vs_llamacpp.py "${1:-pull}" --shape "$SHAPE" --work /tmp/race --layers 16 > "$OUT/pull.log" 2>&1
   echo "pull rc $?" >> "$OUT/pull.log") &
  pulled=$!
}

quantize_early() {  # a CPU-only llama-quantize (no llama-bench), the bf16 file of $3 layers (16) once written (pull $1), as $2
  mkdir -p /tmp/lcpq && tar xJf .lcpp/llama.cpp-*-src.tar.xz -C /tmp/lcpq
  (cd /tmp/lcpq/llama.cpp && cmake -B build -G Ninja -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release \
     > /dev/null && cmake --build build --target llama-quantize -j 12 > /dev/null) > "$OUT/lcpq.log" 2>&1
  local source=/tmp/race/$SHAPE-${3:-16}l-bf16.gguf
  until [ -f $source ] || ! kill -0 "$1" 2> /dev/null; do sleep 2; done
  while [ -f $source ] && [ "$(stat -c %s $source)" != "$(sleep 3; stat -c %s $source)" ]; do :; done
  /tmp/lcpq/llama.cpp/build/bin/llama-quantize $source "/tmp/race/$SHAPE-${3:-16}l-${2,,}.gguf" "$2" 8 \
    > "$OUT/quantize.log" 2>&1
  echo "quantize rc $?" >> "$OUT/lcpq.log"
}

case $CALL in
  setup)
    start_build_and_pull
    timeout 250 python3 -m pytest -q -rfE -m gpu -p no:cacheprovider tests/test_route_plan.py \
      tests/test_prefill_memory.py tests/test_step_graphs.py tests/test_run.py tests/test_slot_experts.py \
      tests/test_block_weight.py > "$OUT/gpu1.log" 2>&1
    echo "rc $?" >> "$OUT/gpu1.log"
    wait $pulled
    timeout 120 python3 -m pytest -q -rfE -m gpu -p no:cacheprovider tests/test_gpu_executor.py \
      tests/test_ggml_blocks.py tests/test_block_gemv.py tests/test_grouped_block_experts.py > "$OUT/gpu2.log" 2>&1
    echo "rc $?" >> "$OUT/gpu2.log"
    wait $build
    timeout 150 python3 benchmarks/vs_llamacpp.py pull --shape "$SHAPE" --work /tmp/race --layers 16 --quant Q4_K_M \
      > "$OUT/pullq.log" 2>&1
    echo "rc $?" >> "$OUT/pullq.log"
    df -h /tmp | tail -1 >> "$OUT/pullq.log"
    tail -n 3 "$OUT"/*.log ;;
  race8 | race6)
    threads=${CALL#race}
    timeout 560 "${RACE[@]}" --settings 16,12,8 --threads "$threads" --prompts 512 "${PRICING[@]}" \
      --out "$OUT/vs$threads.json" > "$OUT/race$threads.log" 2>&1
    echo "rc $?"; tail -n 12 "$OUT/race$threads.log" ;;
  quant)
    timeout 560 "${RACE[@]}" --quant Q4_K_M --settings 16,8 --threads 8 --prompts 512 --ft-timeout 240 \
      --tracebacks-every 30 "${PRICING[@]}" --out "$OUT/vsq.json" > "$OUT/raceq.log" 2>&1
    echo "rc $?"; tail -n 12 "$OUT/raceq.log" ;;
  long)
    timeout 560 "${RACE[@]}" --settings 16 --threads 6,8 --prompts 4096,16384 "${PRICING[@]}" \
      --out "$OUT/vslong.json" > "$OUT/racelong.log" 2>&1
    echo "rc $?"; tail -n 12 "$OUT/racelong.log" ;;
  quick)
    (lscpu; numactl -H; cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpuset.cpus.effective) > "$OUT/cpu_facts.log" 2>&1
    if [ -n "${QUANT:-}" ]; then start_build_and_pull gguf; else start_build_and_pull; fi  # (a quantized race needs no bf16 pull)
    tests=
    if [ -n "${GPU_TESTS:-}" ]; then  # these test files, whole, on CUDA, beside the build and the pull
      # shellcheck disable=SC2086
      (timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider $GPU_TESTS > "$OUT/gpu_tests.log" 2>&1
       echo "rc $?" >> "$OUT/gpu_tests.log") &
      tests=$!
    fi
    if [ -n "${QUANT:-}" ]; then quantize_early $pulled "$QUANT"; fi  # (not waiting for llama-bench's build)
    wait $pulled $build $tests
    tail -n 1 "$OUT/lcpp.log" "$OUT/pull.log"
    QUANTIZED=()
    if [ -n "${QUANT:-}" ]; then
      python3 benchmarks/vs_llamacpp.py pull --shape "$SHAPE" --work /tmp/race --layers 16 --quant "$QUANT" > "$OUT/pullq.log" 2>&1
      tail -n 1 "$OUT/pullq.log"
      QUANTIZED=(--quant "$QUANT")
    fi
    timeout 300 "${RACE[@]}" "${QUANTIZED[@]}" --settings "${SETTINGS:-8}" --threads 8 --prompts 512 \
      --ft-timeout 200 --tracebacks-every 30 "${PRICING[@]}" --out "$OUT/vsquick.json" > "$OUT/racequick.log" 2>&1
    echo "rc $?"; tail -n 12 "$OUT/racequick.log" ;;
  kernels)
    # the block GEMV against cuBLAS bf16 (and, where .clean/ftold.tar.gz is carried, the kernel
    # of that commit side by side), its GPU tests, beside the llama.cpp build and the bf16 pull;
    # then the Q4_K_M race at -ncmoe 8 (~9 min)
    start_build_and_pull
    timeout 120 python3 benchmarks/bench_block_gemv.py --out "$OUT/gemv.json" > "$OUT/gemv.log" 2>&1
    if [ -f "$OLDPWD/.clean/ftold.tar.gz" ]; then
      mkdir -p /tmp/ftold && tar xzf "$OLDPWD/.clean/ftold.tar.gz" -C /tmp/ftold
      PYTHONPATH=/tmp/site:/tmp/ftold timeout 60 python3 benchmarks/bench_block_gemv.py --tiles default \
        --out "$OUT/gemv_old.json" > "$OUT/gemv_old.log" 2>&1
    fi
    timeout 150 python3 -m pytest -q -rfE -m gpu -p no:cacheprovider tests/test_block_gemv.py tests/test_block_weight.py \
      tests/test_slot_experts.py > "$OUT/gpu_kernels.log" 2>&1
    echo "rc $?" >> "$OUT/gpu_kernels.log"
    quantize_early $pulled Q4_K_M
    wait $pulled $build
    python3 benchmarks/vs_llamacpp.py pull --shape "$SHAPE" --work /tmp/race --layers 16 --quant Q4_K_M > "$OUT/pullq.log" 2>&1
    timeout 200 "${RACE[@]}" --quant Q4_K_M --settings 8 --threads 8 --prompts 512 --ft-timeout 150 \
      --tracebacks-every 30 "${PRICING[@]}" --out "$OUT/vsq8.json" > "$OUT/raceq8.log" 2>&1
    echo "rc $?"; tail -n 3 "$OUT/gpu_kernels.log"; tail -n 6 "$OUT/raceq8.log" ;;
  tests)
    # only the $GPU_TESTS files, whole, on CUDA (no llama.cpp, no model file: ~2-4 min on a cold machine)
    # shellcheck disable=SC2086
    timeout 400 python3 -m pytest -q -rfE -p no:cacheprovider ${GPU_TESTS:?the test files} > "$OUT/gpu_tests.log" 2>&1
    echo "rc $?" >> "$OUT/gpu_tests.log"; tail -n 8 "$OUT/gpu_tests.log"
    for dtype in bf16 f8_e4m3 q4_k mxfp4; do  # a prompt chunk's experts: the grouped kernels against the padded runs
      timeout 60 python3 benchmarks/bench_grouped_experts.py --dtype $dtype --reps 10 2>&1 | tee -a "$OUT/grouped.log"
    done ;;
  profile)
    # where a decode token's time goes (benchmarks/profile_decode.py), Q4_K_M against bf16: a
    # CPU-only llama-quantize (no llama-bench needed) beside the bf16 pull, then four profiles
    (python3 benchmarks/vs_llamacpp.py pull --shape "$SHAPE" --work /tmp/race --layers 16 > "$OUT/pull.log" 2>&1
     echo "pull rc $?" >> "$OUT/pull.log") &
    pulled=$!
    quantize_early $pulled Q4_K_M
    python3 benchmarks/vs_llamacpp.py pull --shape "$SHAPE" --work /tmp/race --layers 16 --quant Q4_K_M > "$OUT/pullq.log" 2>&1
    tail -n 1 "$OUT/lcpq.log" "$OUT/pull.log" "$OUT/pullq.log"
    q4=local/$SHAPE-16l-q4_k_m
    PROFILE=(python3 benchmarks/profile_decode.py --store /tmp/race/ft --threads 8)
    timeout 75 "${PROFILE[@]}" --model $q4 --vram-gib 12 --out "$OUT/q4_12g.json" > "$OUT/q4_12g.log" 2>&1
    FT_CUDA_GRAPHS=0 timeout 75 "${PROFILE[@]}" --model $q4 --vram-gib 12 --out "$OUT/q4_12g_eager.json" \
      > "$OUT/q4_12g_eager.log" 2>&1
    timeout 75 "${PROFILE[@]}" --model $q4 --vram-gib 3.57 --out "$OUT/q4_3g.json" > "$OUT/q4_3g.log" 2>&1
    timeout 100 "${PROFILE[@]}" --model local/$SHAPE-16l-bf16 --vram-gib 24 --out "$OUT/bf16_24g.json" \
      > "$OUT/bf16_24g.log" 2>&1
    grep -h '"tok_s' "$OUT"/*.log ;;
  handoff)
    # the CPU share's fixed cost a decode layer call (85 us in the race's bandwidth profile): the
    # hand-off with and without the OpenMP team spinning between calls (libgomp reads its policy at
    # start, so each is its own process)
    for policy in default active; do
      env_policy=()
      if [ $policy = active ]; then env_policy=(OMP_WAIT_POLICY=active); fi
      env "${env_policy[@]}" timeout 150 python3 benchmarks/bench_handoff.py 16 8 300 > "$OUT/handoff_$policy.log" 2>&1
      echo "rc $?" >> "$OUT/handoff_$policy.log"
    done
    tail -n 12 "$OUT"/handoff_*.log ;;
  cpuside)
    # why auto's CPU side is slow in the live runtime (the race's profile: CPU 22.9 GB/s alone and
    # 0.11 of it beside the PCIe fills, where bench_cpu_experts streams 71.7 at 8 threads): the
    # machine's CPU facts (affinity, cgroup quota), the profile's raw points at 4, 8 and 12
    # threads, the kernel alone at the same threads, the hand-off with one CPU expert a layer
    (lscpu; numactl -H; cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpuset.cpus.effective) > "$OUT/cpu_facts.log" 2>&1
    timeout 240 python3 benchmarks/bench_profile.py --threads 4,8,12 --torch-threads 8,1 --dtypes q4_k/q6_k --slots 9 \
      > "$OUT/profile_points.log" 2>&1
    echo "rc $?" >> "$OUT/profile_points.log"
    timeout 150 python3 benchmarks/bench_cpu_experts.py --threads 4,8,12 --dtypes q4_k/q6_k,bf16 --no-reference \
      --reps 10 > "$OUT/cpu_experts.log" 2>&1
    timeout 100 python3 benchmarks/bench_handoff.py 16 8 200 > "$OUT/handoff.log" 2>&1
    cat "$OUT/profile_points.log"; tail -n 12 "$OUT/cpu_experts.log" "$OUT/handoff.log" ;;
  replay)
    # coding-agent sessions through `ft serve` (benchmarks/agent_replay.py): the race file's
    # tokenizer makes about a token a byte of its filler words, so the workload is sized to the
    # file's 40,960-token context: a ~15k-token system prompt, 24 turns of ~1k-token tool results
    layers=${LAYERS:-16}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$OLDPWD"/.whl2/*.whl
    (python3 benchmarks/vs_llamacpp.py gguf --shape "$SHAPE" --work /tmp/race --layers "$layers" > "$OUT/pull.log" 2>&1
     echo "gguf rc $?" >> "$OUT/pull.log") &
    pulled=$!
    quantize_early $pulled Q4_K_M "$layers"
    python3 benchmarks/vs_llamacpp.py pull --shape "$SHAPE" --work /tmp/race --layers "$layers" --quant Q4_K_M > "$OUT/pullq.log" 2>&1
    tail -n 1 "$OUT/lcpq.log" "$OUT/pull.log" "$OUT/pullq.log"
    model=local/$SHAPE-${layers}l-q4_k_m
    FT_HOME=/tmp/race/ft FT_CONTEXT_LENGTH=40960 python3 -c "import ftpull.cli as c; c.main()" serve --port 11435 \
      --device gpu --vram-gib "${VRAM_GIB:-4}" > "$OUT/serve.log" 2>&1 &
    served=$!
    until curl -s http://127.0.0.1:11435/api/version > /dev/null || ! kill -0 $served 2> /dev/null; do sleep 1; done
    timeout "${REPLAY_S:-300}" python3 benchmarks/agent_replay.py --model "$model" --sessions 2 --system-words 2500 \
      --turns 24 --result-words 150 --out "$OUT/replay.json" > "$OUT/replay.log" 2>&1
    echo "replay rc $?" >> "$OUT/replay.log"
    kill $served; wait $served
    tail -n 30 "$OUT/replay.log"; grep -i -E "error|traceback" "$OUT/serve.log" | head -5 ;;
  prompts)
    # where a prompt's time goes at the smallest footprint (benchmarks/profile_prompt.py): the
    # Q4_K_M file's ~9 slots at -ncmoe 16's budget (830 MiB at 16 layers; BUDGET_GIB, default
    # 0.66 at LAYERS=4: the 12 layers' dense weights and KV less), at this commit and, where
    # carried, .clean/ftold.tar.gz's; the bf16 file is written, not pulled (llama-quantize's source)
    layers=${LAYERS:-4}
    (python3 benchmarks/vs_llamacpp.py gguf --shape "$SHAPE" --work /tmp/race --layers "$layers" > "$OUT/pull.log" 2>&1
     echo "gguf rc $?" >> "$OUT/pull.log") &
    pulled=$!
    quantize_early $pulled Q4_K_M "$layers"
    python3 benchmarks/vs_llamacpp.py pull --shape "$SHAPE" --work /tmp/race --layers "$layers" --quant Q4_K_M > "$OUT/pullq.log" 2>&1
    tail -n 1 "$OUT/lcpq.log" "$OUT/pull.log" "$OUT/pullq.log"
    q4=local/$SHAPE-${layers}l-q4_k_m
    PROFILE=(python3 benchmarks/profile_prompt.py --store /tmp/race/ft --threads 8 --tokens 512 --model "$q4")
    budget=${BUDGET_GIB:-0.66}
    timeout 90 "${PROFILE[@]}" --vram-gib "$budget" --out "$OUT/p_q4.json" --trace "$OUT/p_q4_trace.json.gz" \
      > "$OUT/p_q4.log" 2>&1
    if [ -f "$OLDPWD/.clean/ftold.tar.gz" ]; then  # the same at another commit, side by side
      mkdir -p /tmp/ftold && tar xzf "$OLDPWD/.clean/ftold.tar.gz" -C /tmp/ftold
      (cd /tmp/ftold && PYTHONPATH=/tmp/site:/tmp/ftold timeout 60 "${PROFILE[@]}" --vram-gib "$budget" \
        --out "$OUT/p_q4_old.json" > "$OUT/p_q4_old.log" 2>&1)
    fi
    timeout 50 "${PROFILE[@]}" --vram-gib 1.0 --out "$OUT/p_q4_1g.json" > "$OUT/p_q4_1g.log" 2>&1
    grep -h '"tok_s_median\|"cache_slots' "$OUT"/p_*.log ;;
  *) echo "unknown call $CALL" >&2; exit 2 ;;
esac
