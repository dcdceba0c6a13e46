#!/usr/bin/env bash
# Prepare a checkout for building: obtain the pinned llama.cpp source (or validate
# $LLAMA_CPP_DIR), then check the GGML_* flags and SDKs in the environment. Fails within
# seconds, before anything compiles, when a requested backend's SDK is missing.
# `make build` runs it with PYTHON set to the project's .venv (which has pip); run alone
# it uses $PYTHON, else .venv's python when there is one, else python3.
#
#   scripts/setup.sh                  fetch the source, check flags and SDKs
#   scripts/setup.sh --vulkan-headers only fetch Vulkan headers new enough for ggml-vulkan
#                                     (Debian 13's libvulkan-dev, unpacked into the cache);
#                                     needs no Python, so it can run before the first make
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$here/.venv/bin/python" ]; then PYTHON="$here/.venv/bin/python"; else PYTHON=python3; fi
fi

for arg in "$@"; do
  case "$arg" in
    --vulkan-headers) exec bash "$here/scripts/fetch_vulkan_headers.sh" ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

"$PYTHON" "$here/scripts/fetch_llama_cpp.py" >/dev/null
"$PYTHON" "$here/buildtools/buildconfig.py" check
