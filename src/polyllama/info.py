"""What this build of polyllama was compiled with, and llama.cpp's logging."""
from __future__ import annotations

from ._llamacpp_loader import build_info_file, llamacpp


def build_info() -> dict:
    """The llama.cpp commit, ggml version, backends, flags, compiler and build type.

    Read from build_info.json, which CMake writes next to the extension when it is
    built, plus what the loaded extension reports about itself at run time.
    """
    info = build_info_file()
    info["ggml_version_runtime"] = llamacpp.get_ggml_version()
    info["ggml_commit_runtime"] = llamacpp.get_ggml_commit()
    info["registries"] = llamacpp.registries()
    info["system_info"] = llamacpp.system_info()
    # what ggml-cpu repacks weights into here ("AMX" only where the build kept it, see
    # info["cpu_amx"], and the kernel grants the tile state)
    info["cpu_weight_buffers"] = llamacpp.cpu_extra_buffer_types()
    return info


def set_log_level(level: str) -> None:
    """Echo llama.cpp's log lines at or above `level` to stderr.

    One of "debug", "info", "warning", "error" (the default) or "none". Independently
    of this, warnings and errors are kept and attached to exceptions (`err.log`).
    """
    if level not in llamacpp.LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(llamacpp.LOG_LEVELS)}")
    llamacpp.set_log_level(level)
