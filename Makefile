# polyllama developer entry points. Backend flags come from the environment
# (GGML_CUDA=1 make build); CMakeLists.txt resolves them with buildtools/buildconfig.py at
# every configure, exactly as under `pip install .`, so make passes CMake no -DGGML_*
# argument of its own. `make show-backends` shows what they resolve to.
# See README.md and docs/ARCHITECTURE.md.
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
BUILDCONFIG := $(BOOTSTRAP_PYTHON) buildtools/buildconfig.py
PYRUN       := PYTHONPATH=$(CURDIR)/src $(PYTHON)
PYTEST_ARGS ?=

# ccache: paths relative to the checkout, so a fresh clone in another directory still hits.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: build setup show-backends model run test bench sdist wheel test-wheel index clean reset help venv lock

help:
	@echo "make run            build (default backends), fetch the model, show devices, generate"
	@echo "make test           build, fetch the model, run the test suite"
	@echo "make build          build with the GGML_* flags in the environment"
	@echo "make build-<b>      b = $(shell $(BUILDCONFIG) target-names)"
	@echo "make show-backends  flags, SDK detection, and what the built extension contains"
	@echo "make venv           create or update the project's .venv (build tools, test and server extras)"
	@echo "make sdist          dist/polyllama-<v>.tar.gz, carrying the pinned llama.cpp (builds offline)"
	@echo "make wheel          a portable wheel for the GGML_* flags, built offline from the sdist,"
	@echo "                    repaired by auditwheel, in dist/<variant>/ (docs/INSTALL.md)"
	@echo "make test-wheel     the test suite against that wheel installed into a fresh venv"
	@echo "make index          dist/index/<variant>/: PEP 503 indexes for pip --index-url"
	@echo "make model | bench | lock | clean | reset"

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

# setup has checked the flags and SDKs (buildconfig.py check) before anything compiles
build: setup
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPOLYLLAMA_INPLACE=ON \
	  -DPython_EXECUTABLE=$(PYTHON) -DPOLYLLAMA_BUILD_TOOLS=ON $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j $(JOBS) --target _llamacpp llama-completion llama-bench llama-batched-bench llama-server

# build-cpu, build-cuda, ..., build-all, build-auto: the backend flags that target stands for
# (buildconfig.py target-env, from the backend table) set for a sub-make of `build`
build-%:
	$(eval TARGET_ENV := $(shell $(BUILDCONFIG) target-env $*))
	$(if $(TARGET_ENV),,$(error no target build-$*; make build-<b> takes b = $(shell $(BUILDCONFIG) target-names)))
	$(TARGET_ENV) $(MAKE) build

show-backends: $(DEVENV)
	@$(BUILDCONFIG) show
	@echo
	@if ls src/polyllama/_llamacpp*.so >/dev/null 2>&1; then $(PYRUN) -m polyllama info; \
	 else echo "the extension is not built yet (make build)"; fi

model: $(DEVENV)
	$(PYRUN) -m polyllama.default_model

run: build model
	$(PYRUN) -m polyllama info
	$(PYRUN) -m polyllama run -p "The capital of France is" -n 32 --temp 0

test: build model
	$(PYRUN) -m pytest tests $(PYTEST_ARGS)

bench: build model
	$(PYRUN) benchmarks/bench_cpu.py --rounds 3

# Distributions (buildtools/wheel.py; docs/INSTALL.md)
sdist: setup
	$(PYTHON) buildtools/wheel.py sdist

wheel: sdist
	$(PYTHON) buildtools/wheel.py build

# the test suite against that wheel, installed into a fresh venv (build/wheel-venv)
test-wheel: model
	$(PYTHON) buildtools/wheel.py test -- $(PYTEST_ARGS)

index: $(DEVENV)
	$(PYTHON) buildtools/wheel.py index

clean:
	rm -rf build dist src/polyllama/_llamacpp*.so src/polyllama/build_info.json

reset: clean
	rm -rf thirdparty/llama.cpp .venv
