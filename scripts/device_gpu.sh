#!/usr/bin/env bash
# On a GPU device machine, after scripts/device_build.sh: write random-weight llama models
# (1B and 8B shapes; F16, Q8_0, Q4_0), run the GPU tests, and run the benchmark harness.
# Results go to $OUT (or ./device-out). Steps can be chosen: device_gpu.sh models tests bench
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-out}; mkdir -p "$out"
models=${MODELS_DIR:-/tmp/polyllama-models}; mkdir -p "$models"
steps=${*:-models tests bench}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
q=build/cmake/bin/llama-quantize

for step in $steps; do
  case $step in
    models)
      for shape in 1b 8b; do
        f16=$models/llama-$shape-f16.gguf
        [ -f "$f16" ] || python3 benchmarks/make_random_model.py --shape $shape -o "$f16"
        for t in Q4_0 Q8_0; do
          [ -f "$models/llama-$shape-$t.gguf" ] || $q "$f16" "$models/llama-$shape-$t.gguf" $t "$(nproc)" >/dev/null 2>&1
        done
      done
      ls -la "$models" | tee "$out/models.txt" ;;
    tests)
      python3 -m polyllama info | tee "$out/info.txt"
      POLYLLAMA_GPU_TEST_MODEL=$models/llama-1b-Q4_0.gguf python3 -m pytest tests/test_gpu.py -v 2>&1 | tee "$out/gpu-tests.txt" ;;
    bench)
      python3 benchmarks/bench_gpu.py --models-dir "$models" --out "$out" 2>&1 | tee "$out/bench.txt" ;;
  esac
done
