"""The other Python bindings of llama.cpp, measured beside polyllama: llama-cpp-python and
cyllama, when installed. Not part of polyllama itself: benchmarks/bench_cpu.py and
bench_gpu.py pass RUNNERS to polyllama.bench.compare().

Each runs in a child interpreter (benchmarks/peers/<name>_child.py): every binding brings
its own ggml, and two ggml copies (and two CUDA backends) in one process are something no
project supports.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

_CHILDREN = Path(__file__).resolve().parent / "peers"


def _run_child(label: str, module: str, script: str, args: dict) -> dict | None:
    """The child's figures (its last line of output), None when `module` is not installed."""
    if importlib.util.find_spec(module) is None:
        return None
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(_CHILDREN / script), json.dumps(args)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} benchmark failed (exit {proc.returncode}): " + proc.stderr.strip()[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def llama_cpp_python_bench(model: str, threads: int | None, n_gen: int, reps: int, n_gpu_layers: int = 0,
                           flash_attn: bool = False) -> dict | None:
    """llama-cpp-python's streamed generation tokens/s after the prompt "The" (greedy).
    threads=None leaves it its own default thread count; the result says how many it used."""
    return _run_child("llama-cpp-python", "llama_cpp", "llama_cpp_python_child.py",
                      {"model": model, "threads": threads, "ngl": n_gpu_layers, "fa": flash_attn,
                       "reps": reps, "n_gen": n_gen})


def cyllama_bench(model: str, threads: int | None, n_gen: int, reps: int, n_gpu_layers: int = 0) -> dict | None:
    """cyllama's streamed generation tokens/s after the prompt "The" (greedy).
    threads=None measures it as its LLM class runs untold (its context keeps llama.cpp's
    default of 4 threads, whatever the machine has); the result says how many it used."""
    return _run_child("cyllama", "cyllama", "cyllama_child.py",
                      {"model": model, "threads": threads, "ngl": n_gpu_layers, "reps": reps, "n_gen": n_gen})


# polyllama.bench.compare(others=RUNNERS): (key, label, fn(model, threads, n_gen, reps))
RUNNERS = (("llama_cpp_python", "llama-cpp-python", llama_cpp_python_bench),
           ("cyllama", "cyllama", cyllama_bench))
