"""polyllama: llama.cpp for any mix of ggml backends, with the device chosen at run time.

    from polyllama import LLM
    llm = LLM("model.gguf", backend="auto")
    print(llm.generate("The capital of France is", max_tokens=16).text)

The modules that need the compiled extension (polyllama._llamacpp) are imported on first
use, so `polyllama.backend_table`, `polyllama.default_model` and `polyllama.errors` work in a
source tree that has not been built yet.
"""
from __future__ import annotations

import importlib

from .errors import *  # noqa: F401,F403  (the exception hierarchy is part of the API)
from .errors import __all__ as _errors_all  # type: ignore[attr-defined]
from .default_model import default_model_path, fetch_default_model

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily: they need the extension)
_LAZY = {
    "LLM": "llm", "Tokenizer": "llm", "SamplingParams": "sampling", "GenerationResult": "llm", "Placement": "placement",
    "devices": "discovery", "backends": "discovery", "print_backend_summary": "discovery",
    "Device": "discovery", "BackendStatus": "discovery", "build_info": "info",
    "estimate_memory": "placement", "set_log_level": "info", "add_rpc_server": "rpc",
}

__all__ = sorted(["default_model_path", "fetch_default_model", "__version__", *_errors_all, *_LAZY])


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'polyllama' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
