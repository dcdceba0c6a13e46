#!/usr/bin/env bash
# polyllama's CUDA wheels on a GPU machine without network (issue: wheels for each backend).
#   locally:  bash scripts/device/bundle.sh --vulkan --wheel
#   device:   bash scripts/device/wheel.sh build|test       (carry .devcarry)
#
# build  `GGML_CUDA=1 GGML_VULKAN=1 make wheel` (variant cu<major>-vulkan), then the CUDA-only
#        wheel (cu<major>) from the same CMake folder, then the same with
#        POLYLLAMA_CUDA_RUNTIME=static (kept aside as dist/cu<major>-static-runtime/) for its
#        size; a summary of all three goes to $OUT/wheels.txt. Long: run it in the background
#        (setsid) and wait for /tmp/polyllama-wheel.done across calls.
# test   for the shared-runtime wheels: a fresh venv with nothing but the wheel (--no-deps)
#        and pytest; first without NVIDIA's runtime wheels (the import must fail naming them),
#        then with them (the image's nvidia/ packages made visible by a .pth file), the CUDA
#        toolkit's own libraries taken off the loader's path; tests/test_gpu.py against it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
out=/tmp/polyllama-wheel-out; mkdir -p "$out"
tools=/tmp/polyllama-wheel-tools
if [ ! -d "$tools/auditwheel" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$tools" .devcarry/wheel-tools/*.whl
fi
export PYTHONPATH=$tools PATH=$tools/bin:$PATH JOBS=${JOBS:-$(nproc)}
export POLYLLAMA_DEVENV=off VIRTUAL_ENV=${VIRTUAL_ENV:-$(python3 -c 'import sys; print(sys.prefix)')}
major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')

case "${1:-}" in
  build)
    rm -f /tmp/polyllama-wheel.done
    t0=$(date +%s)
    GGML_CUDA=1 GGML_VULKAN=1 make wheel
    t1=$(date +%s)
    GGML_CUDA=1 GGML_VULKAN=0 make wheel
    t2=$(date +%s)
    rm -rf "dist/cu$major-shared" && cp -r "dist/cu$major" "dist/cu$major-shared"
    # measured, not shipped (MEASURE_STATIC=0 skips it): if linking cuBLAS statically
    # fails, the shared wheels stand
    if [ "${MEASURE_STATIC:-1}" = 0 ]; then
      rm -rf "dist/cu$major"; echo "device/wheel: static-runtime wheel not built (MEASURE_STATIC=0)"
    elif POLYLLAMA_CUDA_RUNTIME=static GGML_CUDA=1 GGML_VULKAN=0 make wheel; then
      rm -rf "dist/cu$major-static-runtime" && mv "dist/cu$major" "dist/cu$major-static-runtime"
    else
      echo "device/wheel: the static-runtime wheel failed (see above)"; rm -rf "dist/cu$major"
    fi
    t3=$(date +%s)
    mv "dist/cu$major-shared" "dist/cu$major"
    {
      echo "cu$major-vulkan $((t1 - t0)) s, cu$major $((t2 - t1)) s, static runtime $((t3 - t2)) s"
      for d in dist/*/; do for w in "$d"*.whl; do
        echo "$(basename "$d") $(stat -c %s "$w") bytes $(basename "$w")"
        python3 -m zipfile -l "$w" | awk 'NR > 1 && $NF > 1000000 {print "    " $0}'
      done; done
    } 2>&1 | tee "$out/wheels.txt"
    touch /tmp/polyllama-wheel.done ;;
  test)
    # tests/test_gpu.py's model: a random-weight 1B llama, Q4_0 (llama-quantize from the
    # wheel's CMake folder, which defines llama.cpp's tools)
    wheel_cmake=$(ls -d build/wheel/cmake-py*)
    cmake --build "$wheel_cmake" --target llama-quantize >/dev/null
    SHAPES=1b QUANTS=Q4_0 QUANTIZE=$wheel_cmake/bin/llama-quantize bash scripts/device/gpu.sh models
    m=${MODELS_DIR:-/tmp/polyllama-models}/llama-1b-Q4_0.gguf
    export POLYLLAMA_GPU_TEST_MODEL=$m
    # the CUDA toolkit's libraries off the loader's path: LD_LIBRARY_PATH and ld.so.conf
    unset LD_LIBRARY_PATH
    for f in /etc/ld.so.conf.d/*.conf; do
      while read -r dir; do
        if ls "$dir"/libcudart.so* >/dev/null 2>&1; then
          mkdir -p /tmp/ldconf-off && mv "$f" /tmp/ldconf-off/ && echo "off the loader path: $f ($dir)"; break
        fi
      done < <(grep -v '^#' "$f" 2>/dev/null || true)
    done
    ldconfig
    { echo "ld cache entries for libcudart/libcublas: $(ldconfig -p | grep -cE 'libcudart|libcublas' || true)"; } | tee "$out/wheel-tests.txt"
    nv=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
    # the venvs see nothing of this script's tools (PYTHONPATH) or of the image's packages
    unset PYTHONPATH
    set +e
    for variant in "cu$major" "cu$major-vulkan"; do
      whl=$(ls dist/$variant/polyllama-*.whl)
      venv=/tmp/wv-$variant; rm -rf "$venv"
      # --without-pip: the image's Python may lack ensurepip; its pip installs into the venv
      python3 -m venv --without-pip "$venv"
      python3 -m pip --python "$venv/bin/python" install -q --no-index --no-deps "$whl" \
        .devcarry/wheel-tools/{pytest,pluggy,iniconfig,packaging,pygments}-*.whl
      site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
      {
        echo "== $variant: $(basename "$whl") ($(stat -c %s "$whl") bytes)"
        echo "-- Requires-Dist: $("$venv/bin/python" -c "import importlib.metadata as m; print(m.requires('polyllama'))")"
        echo "-- without NVIDIA's runtime wheels:"
        (cd /tmp && "$venv/bin/python" -c 'import polyllama; polyllama.devices()' 2>&1 | tail -1)
        # what pip would install from the wheel's Requires-Dist: here the image's copies
        mkdir -p "$venv/nvidia-wheels" && ln -sfn "$nv" "$venv/nvidia-wheels/nvidia"
        echo "$venv/nvidia-wheels" > "$site/nvidia-runtime.pth"
        echo "-- with them:"
        (cd /tmp && "$venv/bin/python" -c '
import polyllama
print(polyllama.__file__)
print([(d.name, d.backend) for d in polyllama.devices()])
print(sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcudart" in l or "libcublas" in l}))')
        POLYLLAMA_TEST_INSTALLED=1 "$venv/bin/python" -m pytest -o pythonpath=. -p no:cacheprovider -v tests/test_gpu.py 2>&1 | tail -25
      } 2>&1 | tee -a "$out/wheel-tests.txt"
    done ;;
  *) echo "device/wheel.sh: build or test" >&2; exit 2 ;;
esac
