#!/usr/bin/env bash
# On a GPU device machine, after scripts/device/build.sh: write random-weight llama models
# (1B and 8B shapes; F16, Q8_0, Q4_0), run the GPU tests, and run the benchmark harness for
# every GPU backend of the build (CUDA, and Vulkan when it was built in).
# Results go to $OUT (or ./device-out). Steps can be chosen: device/gpu.sh models tests bench
# (default), engine (benchmarks/bench_engine.py; ENGINE_MODELS, ENGINE_ARGS, TAG), and multi
# on a machine with two GPUs: tests/test_multi_gpu.py (multi-tests) and
# benchmarks/bench_multi_gpu.py (multi-bench)
# over MULTI_MODELS (default "llama-8b-Q4_0 llama-8b-f16"; write them first with
# SHAPES=8b QUANTS=Q4_0 ... models), with MULTI_ARGS (more bench_multi_gpu.py options, e.g.
# "--placements one,layer --device-sampling on") and TAG naming the run in $out.
# SHAPES (default "1b 8b") and QUANTS (default "Q4_0 Q8_0") pick the models written, QUANTIZE
# the llama-quantize to use (default build/cmake/bin's), and
# BENCH_ARGS passes more options to benchmarks/bench_gpu.py (e.g. "--types Q4_0 -r 2").
# POLYLLAMA_COMMIT names the commit in the reports' headers: the device tool's copy of the
# tree can carry a stale .git, and without it they read "<that HEAD>+changes".
# A step that finished is not run again on the same machine (markers in /tmp/polyllama-done),
# so after a command that hit the device tool's 10-minute limit the same line continues.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
out=${OUT:-device-out}; mkdir -p "$out"
models=${MODELS_DIR:-/tmp/polyllama-models}; mkdir -p "$models"
done_dir=/tmp/polyllama-done; mkdir -p "$done_dir"
steps=${*:-models tests bench}
# multi is its two halves, each marked done on its own: a bench cut off by the 10-minute
# limit does not run the tests again
steps=$(for s in $steps; do [ "$s" = multi ] && echo multi-tests multi-bench || echo "$s"; done)
# thirdparty/llama.cpp/gguf-py: the gguf writer (random models, tests/gguf_corpus.py), absent from the image
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}:$PWD/thirdparty/llama.cpp/gguf-py PYTHONUNBUFFERED=1
[ -d /tmp/lcp-site/llama_cpp ] && export PYTHONPATH=$PYTHONPATH:/tmp/lcp-site
q=${QUANTIZE:-build/cmake/bin/llama-quantize}

for step in $steps; do
  mark=$step; [ "$step" = engine ] && mark="engine${TAG:-}-$(echo ${ENGINE_MODELS:-default} | tr ' ' +)"
  [ "$step" = multi-bench ] && mark="multi-bench${TAG:-}"
  if [ -f "$done_dir/$mark" ]; then echo "device/gpu: $mark already done on this machine"; continue; fi
  t0=$(date +%s)
  case $step in
    models)
      for shape in ${SHAPES:-1b 8b}; do
        f16=$models/llama-$shape-f16.gguf
        # written under .part names, renamed when whole: a command cut off by the device
        # tool's limit leaves no half-written model for the next one to take as done
        [ -f "$f16" ] || { python3 benchmarks/make_random_model.py --shape $shape -o "$f16.part" && mv "$f16.part" "$f16"; } || exit 1
        for t in ${QUANTS:-Q4_0 Q8_0}; do
          m=$models/llama-$shape-$t.gguf
          [ -f "$m" ] || { $q "$f16" "$m.part" $t "$(nproc)" >/dev/null 2>&1 && mv "$m.part" "$m"; } || exit 1
        done
      done
      ls -la "$models" | tee "$out/models.txt" ;;
    tests)
      python3 -m polyllama info | tee "$out/info.txt"
      POLYLLAMA_GPU_TEST_MODEL=$models/llama-1b-Q4_0.gguf python3 -m pytest -s -v -p no:cacheprovider \
        tests/test_gpu.py 2>&1 | tee "$out/gpu-tests.txt" ;;
    multi-tests)
      POLYLLAMA_GPU_TEST_MODEL=$models/llama-1b-Q4_0.gguf python3 -m pytest -s -v -p no:cacheprovider \
        tests/test_multi_gpu.py 2>&1 | tee "$out/multi-gpu-tests.txt" ;;
    multi-bench)
      python3 -X faulthandler benchmarks/bench_multi_gpu.py --backend cuda --threads "$(nproc)" \
        $(for m in ${MULTI_MODELS:-llama-8b-Q4_0 llama-8b-f16}; do printf -- '--model %s ' "$models/$m.gguf"; done) \
        ${MULTI_ARGS:-} --out "$out/multi-gpu${TAG:-}" 2>&1 | tee "$out/multi-gpu-bench${TAG:-}.txt" ;;
    engine)
      # benchmarks/bench_engine.py on CUDA for each of ENGINE_MODELS (default "llama-1b-Q4_0
      # llama-8b-Q4_0"), with ENGINE_ARGS (default "--widths 16,64 --rounds 2"); TAG names the
      # run in $out (engine-<model><TAG>), so that two settings can run on one machine
      for m in ${ENGINE_MODELS:-llama-1b-Q4_0 llama-8b-Q4_0}; do
        python3 -X faulthandler benchmarks/bench_engine.py --model "$models/$m.gguf" --backend cuda \
          --threads "$(nproc)" ${ENGINE_ARGS:---widths 16,64 --rounds 2} --out "$out/engine-$m${TAG:-}" \
          2>&1 | tee "$out/engine-$m${TAG:-}.txt" || break
      done ;;
    bench)
      gpu_backends=$(python3 -c 'from polyllama import devices
print(",".join(dict.fromkeys(d.backend for d in devices() if d.type in ("GPU", "iGPU") and d.is_offload_target and not d.software)))')
      python3 -X faulthandler benchmarks/bench_gpu.py --models-dir "$models" --out "$out" --backends "$gpu_backends" ${BENCH_ARGS:-} \
        2>&1 | tee "$out/bench.txt" ;;
    *) echo "device/gpu: unknown step $step" >&2; exit 2 ;;
  esac
  rc=${PIPESTATUS[0]}
  echo "device/gpu: $step $(( $(date +%s) - t0 )) s (exit $rc)" | tee -a "$out/steps.txt"
  # a failed step runs again next time; models needs no mark: it skips each file it has
  [ "$rc" = 0 ] && [ "$step" != models ] && touch "$done_dir/$mark"
done
