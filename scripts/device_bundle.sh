#!/usr/bin/env bash
# Pack what a machine without network needs to build polyllama: the pinned llama.cpp tree
# (trimmed: no docs/media/web UI, only the one test vocabulary the random models use)
# into .devcarry/llama.cpp.tar.gz (git-ignored; about 10 MB). Carry .devcarry with the
# device tool:  run(command="bash scripts/device_build.sh", carry=[".devcarry"])
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/fetch_llama_cpp.py >/dev/null
mkdir -p .devcarry
tar czf .devcarry/llama.cpp.tar.gz -C thirdparty \
  --exclude='llama.cpp/docs' --exclude='llama.cpp/media' --exclude='llama.cpp/tools/ui' \
  --exclude='llama.cpp/tools/server/public*' --exclude='llama.cpp/models/*' \
  --exclude='llama.cpp/examples/*/*.swift' --exclude='llama.cpp/app' \
  llama.cpp
# the random-weight models copy Llama 3's tokenizer from this test vocabulary
cp thirdparty/llama.cpp/models/ggml-vocab-llama-bpe.gguf .devcarry/
du -sh .devcarry/*
