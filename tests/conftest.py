"""Shared fixtures: the real default model, one CPU LLM per session, llama.cpp's own tools.

Nothing here is mocked: tests run the compiled extension on SmolLM2-135M-Instruct and
compare with llama.cpp's tools built from the same pinned tree (make build builds them).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# ggml-vulkan hides CPU-type devices (Mesa's lavapipe) unless this is set; the Vulkan tests
# run on lavapipe where there is no GPU. Set before anything imports the extension.
os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
# `make test-wheel` runs this suite against a wheel installed into a fresh venv
# (POLYLLAMA_TEST_INSTALLED=1): then neither this process nor a child it starts may import
# the package from src/ (tests/test_wheel.py checks which copy was imported).
INSTALLED = os.environ.get("POLYLLAMA_TEST_INSTALLED") == "1"
if INSTALLED:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != SRC]


def child_env(base=None, **extra) -> dict:
    """The environment of a child Python that must import the same polyllama as the tests:
    src/ on PYTHONPATH for the development tree, nothing added for an installed wheel."""
    env = dict(os.environ if base is None else base)
    if not INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.update(extra)
    return env
TOOLS_DIR = Path(os.environ.get("POLYLLAMA_TOOLS_DIR", ROOT / "build" / "cmake" / "bin"))
THREADS = 2


@pytest.fixture(scope="session")
def model_path() -> str:
    from polyllama.default_model import default_model_path
    return str(default_model_path())


@pytest.fixture(scope="session")
def gpu_model() -> str:
    """The model of the GPU tests: $POLYLLAMA_GPU_TEST_MODEL (a random-weight llama on the
    device machines, where the default model cannot travel), else the default model."""
    path = os.environ.get("POLYLLAMA_GPU_TEST_MODEL")
    if path:
        return path
    from polyllama.default_model import default_model_path
    return str(default_model_path())


@pytest.fixture(scope="session")
def llm(model_path):
    from polyllama import LLM
    with LLM(model_path, backend="cpu", n_threads=THREADS, n_ctx=4096) as m:
        yield m


def tool(name: str) -> Path:
    path = TOOLS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: `make build` builds llama.cpp's tools "
                                "(or set POLYLLAMA_TOOLS_DIR)")
    return path


def llama_completion(model: str, prompt: str, n: int, extra=()) -> str:
    """Greedy continuation by llama.cpp's own llama-completion (prompt not echoed).

    `--device none` keeps it on the CPU like the `llm` fixture: with lavapipe made visible
    above, llama-completion would otherwise offload to it and round differently.
    """
    cmd = [str(tool("llama-completion")), "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
           "--device", "none",
           "-t", str(THREADS), "-c", "4096", "-no-cnv", "--no-display-prompt", "--simple-io",
           "--no-warmup", "-s", "1", *extra]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"llama-completion failed ({out.returncode}): {out.stderr.decode()[-2000:]}")
    text = out.stdout.decode("utf-8", "replace")
    # completion.cpp prints "\n\n" when it exits (LOG("\n\n") at the end of main)
    assert text.endswith("\n\n"), repr(text[-40:])
    return text[:-2]
