"""The wheel's dependencies, decided when it is built (a scikit-build-core metadata plugin).

pyproject.toml marks `dependencies` dynamic and names this module in [[tool.dynamic-metadata]].
A wheel whose extension loads CUDA's runtime and cuBLAS at run time (GGML_CUDA with
POLYLLAMA_CUDA_RUNTIME=shared, the default) depends on NVIDIA's PyPI wheels of the toolkit
major version it was compiled with (backend_table.CUDA_RUNTIME_WHEELS), so that
`pip install polyllama` brings them; every other build depends on nothing. The sdist says
Requires-Dist is dynamic: it is decided by the flags of the machine that builds the wheel.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _buildconfig():
    sys.path.insert(0, _HERE)
    try:
        import buildconfig
    finally:
        sys.path.remove(_HERE)
    return buildconfig


def runtime_dependencies(env=None) -> list:
    """The requirements of a wheel built under `env` (default: this process's environment)."""
    bc = _buildconfig()
    config = bc.resolve(env, check=False)
    if not config.enabled.get("cuda") or config.options.get("POLYLLAMA_CUDA_RUNTIME") != "shared":
        return []
    cuda = config.sdks.get("cuda")
    if cuda is None or not cuda.version:
        raise RuntimeError("GGML_CUDA is on but the CUDA toolkit's version is unknown (nvcc not found); "
                           "the wheel's runtime dependencies depend on it")
    requirements, _ = bc._table.cuda_runtime_wheels(cuda.version)
    return list(requirements)


_state = "metadata_wheel"


def build_state(state: str) -> None:
    global _state
    _state = state


def dynamic_wheel(settings) -> dict:
    return {"dependencies": True}


def dynamic_metadata(settings, project) -> dict:
    if _state == "sdist":
        return {"dependencies": []}
    return {"dependencies": runtime_dependencies()}
