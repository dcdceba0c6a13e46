#!/usr/bin/env bash
# Prepare a checkout for building: obtain the pinned llama.cpp source (or validate
# $LLAMA_CPP_DIR), then check the GGML_* flags and SDKs in the environment. Fails within
# seconds, before anything compiles, when a requested backend's SDK is missing.
#
#   scripts/setup.sh                  fetch the source, check flags and SDKs
#   scripts/setup.sh --vulkan-headers also fetch Vulkan headers new enough for ggml-vulkan
#                                     (Debian 13's libvulkan-dev, unpacked into the cache)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}

for arg in "$@"; do
  case "$arg" in
    --vulkan-headers) bash "$here/scripts/fetch_vulkan_headers.sh" ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

"$PYTHON" "$here/scripts/fetch_llama_cpp.py" >/dev/null
"$PYTHON" "$here/src/polyllama/buildconfig.py" check
