"""The compiled extension, polyllama._llamacpp, as `llamacpp`.

Before loading it, what an installed wheel needs from the machine is checked, so that a
mismatch is an error that says what to do rather than a crash or a bare ImportError:

* a portable build (`make wheel`) records in build_info.json the x86 instruction sets it
  compiled ggml-cpu with; a CPU without one of them would die of SIGILL at the first
  matrix product, so it is refused here (ExtensionLoadError);
* a backend's shared library that belongs to the system (libvulkan.so.1, libOpenCL.so.1:
  the backend table's system_libs, which a wheel does not carry) missing is named, with
  what installs it;
* a CUDA build with the shared runtime loads libcudart and cuBLAS from NVIDIA's PyPI wheels
  when they are installed (the wheel declares them), else from the system's loader path;
  when neither has them, ExtensionLoadError names the packages.

Where the extension was never built, ExtensionNotBuiltError says how to build it.
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import sys

from .backend_table import BACKENDS, CPU_ISA_FLAGS, cuda_runtime_wheels, host_path
from .errors import ExtensionLoadError, ExtensionNotBuiltError

_HERE = os.path.dirname(os.path.abspath(__file__))


def build_info_file() -> dict:
    """build_info.json of this package (what the extension was compiled with), {} if absent."""
    try:
        with open(os.path.join(_HERE, "build_info.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _cpu_flags():
    """The CPU's feature flags (Linux), or None where they cannot be read."""
    try:
        with open(host_path("/proc/cpuinfo"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def missing_cpu_features(info: dict) -> list:
    """The /proc/cpuinfo flags that the build's instruction sets need and this CPU lacks."""
    flags = _cpu_flags()
    if flags is None:
        return []
    return [CPU_ISA_FLAGS[isa] for isa in info.get("cpu_isa", ())
            if isa in CPU_ISA_FLAGS and CPU_ISA_FLAGS[isa] not in flags]


def _nvidia_lib_dirs() -> list:
    """lib/ folders of NVIDIA's runtime wheels on sys.path (nvidia/cuda_runtime/lib for
    CUDA 12's wheels, nvidia/cu13/lib for CUDA 13's)."""
    dirs = []
    for entry in sys.path:
        root = os.path.join(entry or ".", "nvidia")
        if os.path.isdir(root):
            dirs += sorted(glob.glob(os.path.join(root, "*", "lib")))
    return dirs


def preload_cuda_runtime(info: dict) -> list:
    """Load the CUDA runtime libraries a shared-runtime CUDA build needs from NVIDIA's
    wheels, where installed, so the extension's dynamic linker finds them already loaded.
    Returns the paths loaded."""
    if info.get("cuda_runtime") != "shared" or not info.get("cuda_version"):
        return []
    try:
        _, sonames = cuda_runtime_wheels(info["cuda_version"])
    except ValueError:
        return []
    loaded = []
    dirs = _nvidia_lib_dirs()
    for soname in sonames:
        for d in dirs:
            path = os.path.join(d, soname)
            if os.path.isfile(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue   # a damaged copy: the extension's own load says what is missing
                loaded.append(path)
                break
    return loaded


def _load():
    info = build_info_file()
    missing = missing_cpu_features(info)
    if missing:
        raise ExtensionLoadError(
            "this polyllama was built for CPUs with " + ", ".join(info.get("cpu_isa", ()))
            + f" and this CPU lacks {', '.join(missing)}; loading it would crash the interpreter "
            "(illegal instruction). Build it for this machine instead: "
            "pip install --no-binary polyllama polyllama (docs/INSTALL.md)")
    preload_cuda_runtime(info)
    try:
        from . import _llamacpp
    except ImportError as e:
        text = str(e)
        if info and ("libcudart" in text or "libcublas" in text) and info.get("cuda_version"):
            try:
                reqs = " ".join(f"'{r}'" for r in cuda_runtime_wheels(info["cuda_version"])[0])
            except ValueError:
                reqs = "the CUDA runtime of the toolkit it was built with"
            raise ExtensionLoadError(
                f"polyllama was built with CUDA {info['cuda_version']} and needs its runtime "
                f"libraries: pip install {reqs} (or put the CUDA toolkit's lib64 on "
                f"LD_LIBRARY_PATH); loader error: {text}") from e
        for b in BACKENDS:
            for lib, provider in b.system_libs:
                if lib in text and b.name in info.get("backends", ()):
                    raise ExtensionLoadError(
                        f"this polyllama carries the {b.title} backend, which needs {lib} from the "
                        f"system, and it does not load: {text}. It comes with {provider}; or install "
                        "a polyllama variant without that backend (docs/INSTALL.md)") from e
        if not isinstance(e, ModuleNotFoundError):
            raise ExtensionLoadError(f"polyllama's extension is installed but does not load: {text}") from e
        raise ExtensionNotBuiltError(
            "polyllama's compiled extension (polyllama._llamacpp) is not built: run `make build` "
            "(or `GGML_<BACKEND>=1 make build`) in the source tree, or `pip install .`; "
            f"import error: {text}") from e
    return _llamacpp


llamacpp = _load()
