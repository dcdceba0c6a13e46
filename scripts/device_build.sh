#!/usr/bin/env bash
# Build polyllama with CUDA on a device machine (no network) in one step.
#   locally:   bash scripts/device_bundle.sh
#   device:    bash scripts/device_build.sh            (carry .devcarry)
# Unpacks the carried llama.cpp tree, then runs the same `make build-cuda` as anywhere
# else; CMAKE_CUDA_ARCHITECTURES comes from the detected GPU (nvidia-smi), overridable.
# Extra backends: GGML_VULKAN=1 etc. in the environment. llama-quantize is built too
# (for the random-weight benchmark models).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f thirdparty/llama.cpp/include/llama.h ]; then
  mkdir -p thirdparty
  tar xzf .devcarry/llama.cpp.tar.gz -C thirdparty
  mkdir -p thirdparty/llama.cpp/models
  cp .devcarry/ggml-vocab-llama-bpe.gguf thirdparty/llama.cpp/models/
fi
export JOBS=${JOBS:-$(nproc)}
t0=$(date +%s)
GGML_CUDA=${GGML_CUDA:-1} make build
cmake --build build/cmake -j "$JOBS" --target llama-quantize
echo "device_build: $(( $(date +%s) - t0 )) s"
