#!/usr/bin/env bash
# Build polyllama with CUDA (and, when carried, Vulkan) on a GPU machine without network.
#   locally:   bash scripts/device/bundle.sh [--vulkan] [--llama-cpp-python]
#   device:    bash scripts/device/build.sh [--llama-cpp-python]      (carry .devcarry)
#
# Unpacks the carried llama.cpp tree, then runs the same `make build` as anywhere else with
# GGML_CUDA=1 (and GGML_VULKAN=1 when the bundle has .devcarry/vulkan; set GGML_VULKAN=0 to
# skip it). CMAKE_CUDA_ARCHITECTURES comes from the detected GPU (nvidia-smi), overridable.
# Also builds llama-quantize (for the random-weight benchmark models) and
# llama-batched-bench (the reference for batched generation).
# --llama-cpp-python: also build the carried llama-cpp-python sdist with CUDA, against the
# same llama.cpp tree, into /tmp/lcp-site (benchmarks/bench_gpu.py picks it up).
# A command on the device may run 10 minutes: when one ends before the build does, run the
# script again at once (within the 30 s the machine stays warm); ninja resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
want_lcp=0
for arg in "$@"; do
  case "$arg" in
    --llama-cpp-python) want_lcp=1 ;;
    *) echo "device/build.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
export JOBS=${JOBS:-$(nproc)}
# no network there: make uses the image's Python environment as it is (Cython, ninja and
# scikit-build-core are in it) instead of creating .venv from PyPI (buildtools/devenv.py)
export POLYLLAMA_DEVENV=off VIRTUAL_ENV=${VIRTUAL_ENV:-$(python3 -c 'import sys; print(sys.prefix)')}
if [ -d .devcarry/vulkan ]; then export GGML_VULKAN=${GGML_VULKAN:-1}; fi
t0=$(date +%s)
GGML_CUDA=${GGML_CUDA:-1} make build
cmake --build build/cmake -j "$JOBS" --target llama-quantize llama-batched-bench
echo "device/build: polyllama $(( $(date +%s) - t0 )) s"

if [ $want_lcp = 1 ] && [ ! -d /tmp/lcp-site/llama_cpp ]; then
  t1=$(date +%s)
  src=/tmp/lcp-src
  if [ ! -d "$src" ]; then
    mkdir -p "$src"
    tar xzf .devcarry/llama_cpp_python-*-novendor.tar.gz -C "$src" --strip-components=1
    mkdir -p "$src/vendor"
    cp -r thirdparty/llama.cpp "$src/vendor/llama.cpp"
  fi
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
  # the same CUDA options as polyllama's build; a fixed build dir lets a second run resume
  CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-${arch:-90}} -DLLAVA_BUILD=OFF" \
    python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/lcp-wheel \
      --config-settings=build-dir=/tmp/lcp-build "$src"
  python3 -m pip install -q --no-index --no-deps --target /tmp/lcp-site /tmp/lcp-wheel/llama_cpp_python-*.whl \
    .devcarry/wheels/*.whl
  echo "device/build: llama-cpp-python $(( $(date +%s) - t1 )) s"
fi
