# polyllama developer entry points. Backend flags come from the environment
# (GGML_CUDA=1 make build) and are resolved by src/polyllama/buildconfig.py, the same
# code CMakeLists.txt runs under `pip install .`. `make -n build-cuda` shows the CMake
# command line with its -DGGML_* flags. See README.md and docs/ARCHITECTURE.md.
#
# Every target runs in the project's virtual environment: .venv (or the active one when
# $VIRTUAL_ENV is set), made and kept in step with pyproject.toml + requirements-dev.lock
# by buildtools/devenv.py, which first checks for what pip cannot install (compilers,
# CMake, Python's headers and venv module). BOOTSTRAP_PYTHON only creates it.

BOOTSTRAP_PYTHON ?= python3
ifneq ($(strip $(VIRTUAL_ENV)),)
VENV        ?= $(VIRTUAL_ENV)
else
VENV        ?= $(CURDIR)/.venv
endif
PYTHON      := $(VENV)/bin/python
DEVENV      := $(VENV)/.polyllama-devenv
export PATH := $(VENV)/bin:$(PATH)
BUILD_DIR   ?= build/cmake
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
# buildconfig.py uses the standard library only, so `make -n` works before .venv exists
BUILDCONFIG := $(BOOTSTRAP_PYTHON) src/polyllama/buildconfig.py
PYRUN       := PYTHONPATH=$(CURDIR)/src $(PYTHON)
PYTEST_ARGS ?=

# ccache: paths relative to the checkout, so a fresh clone in another directory still hits.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

# Evaluated only when a recipe uses it (recursive variable): detection runs at build time.
CMAKE_FLAGS = $(shell $(BUILDCONFIG) cmake-args)

.PHONY: build build-cpu build-cuda build-hip build-sycl build-metal build-vulkan build-opencl \
        build-rpc build-blas build-all build-auto setup show-backends model run test bench \
        wheel clean reset help venv lock

help:
	@echo "make run            build (default backends), fetch the model, show devices, generate"
	@echo "make test           build, fetch the model, run the test suite"
	@echo "make build          build with the GGML_* flags in the environment"
	@echo "make build-<b>      b = cpu cuda hip sycl metal vulkan opencl rpc blas all auto"
	@echo "make show-backends  flags, SDK detection, and what the built extension contains"
	@echo "make venv           create or update the project's .venv (build tools, test and server extras)"
	@echo "make model | bench | wheel | lock | clean | reset"

# the environment: checked and (re)installed only when pyproject.toml or the lock changed
venv: $(DEVENV)
ifeq ($(POLYLLAMA_DEVENV),off)
# no network (GPU machines): the environment is used as it is, checked on every run
.PHONY: $(DEVENV)
endif
$(DEVENV): pyproject.toml requirements-dev.lock buildtools/devenv.py
	@$(BOOTSTRAP_PYTHON) buildtools/devenv.py "$(VENV)" >/dev/null

lock:
	$(BOOTSTRAP_PYTHON) buildtools/devenv.py --lock

setup: $(DEVENV)
	PYTHON=$(PYTHON) bash scripts/setup.sh

build: setup
	$(BUILDCONFIG) check
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPOLYLLAMA_INPLACE=ON \
	  -DPython_EXECUTABLE=$(PYTHON) \
	  -DPOLYLLAMA_BUILD_TOOLS=ON -DPOLYLLAMA_FLAGS_FROM_COMMAND_LINE=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS) --target _core llama-completion llama-bench llama-batched-bench llama-server

# One target per backend: the flag is set for the sub-make, which prints its cmake line.
build-cpu:
	GGML_CUDA=0 GGML_HIP=0 GGML_SYCL=0 GGML_METAL=0 GGML_VULKAN=0 GGML_OPENCL=0 GGML_RPC=0 GGML_BLAS=0 $(MAKE) build
build-cuda:
	GGML_CUDA=1 $(MAKE) build
build-hip:
	GGML_HIP=1 $(MAKE) build
build-sycl:
	GGML_SYCL=1 $(MAKE) build
build-metal:
	GGML_METAL=1 $(MAKE) build
build-vulkan:
	GGML_VULKAN=1 $(MAKE) build
build-opencl:
	GGML_OPENCL=1 $(MAKE) build
build-rpc:
	GGML_RPC=1 $(MAKE) build
build-blas:
	GGML_BLAS=1 $(MAKE) build
# every backend this platform can have; fails fast naming each missing SDK
build-all:
	GGML_CUDA=1 GGML_HIP=1 GGML_SYCL=1 GGML_VULKAN=1 GGML_OPENCL=1 GGML_RPC=1 $(MAKE) build
# every backend whose SDK (and device) is detected here
build-auto:
	GGML_AUTO=1 $(MAKE) build

show-backends: $(DEVENV)
	@$(BUILDCONFIG) show
	@echo
	@if ls src/polyllama/_core*.so >/dev/null 2>&1; then $(PYRUN) -m polyllama info; \
	 else echo "the extension is not built yet (make build)"; fi

model: $(DEVENV)
	$(PYRUN) -m polyllama.models

run: build model
	$(PYRUN) -m polyllama info
	$(PYRUN) -m polyllama run -p "The capital of France is" -n 32 --temp 0

test: build model
	$(PYRUN) -m pytest tests $(PYTEST_ARGS)

bench: build model
	$(PYRUN) benchmarks/bench_cpu.py --rounds 3

wheel: setup
	$(PYTHON) -m pip wheel --no-deps -w dist .

clean:
	rm -rf build dist src/polyllama/_core*.so src/polyllama/build_info.json

reset: clean
	rm -rf thirdparty/llama.cpp .venv
