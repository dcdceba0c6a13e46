"""polyllama's exceptions: one hierarchy under PolyllamaError.

Every error a user can cause (bad arguments, a missing backend, a corrupt file, not
enough memory) is raised as one of these, with a message that says how to fix it.
"""
from __future__ import annotations

__all__ = [
    "PolyllamaError",
    "ExtensionNotBuiltError",
    "ExtensionLoadError",
    "BackendError",
    "UnknownBackendError",
    "BackendNotCompiledError",
    "NoDeviceError",
    "DeviceNotFoundError",
    "ConflictingArgumentsError",
    "InsufficientMemoryError",
    "ModelLoadError",
    "LoadAbortedError",
    "ContextError",
    "ContextOverflowError",
    "DecodeError",
    "RemoteDeviceError",
    "GrammarError",
    "TemplateError",
    "ModelFetchError",
]


class PolyllamaError(Exception):
    """Base class of every polyllama error.

    `log` holds the warnings/errors llama.cpp printed while the failing call ran (may be "").
    """

    def __init__(self, message: str = "", *, log: str = ""):
        super().__init__(message)
        self.log = log


class ExtensionNotBuiltError(PolyllamaError, ImportError):
    """The compiled extension polyllama._llamacpp is missing (the package was not built)."""


class ExtensionLoadError(PolyllamaError, ImportError):
    """The extension is installed but cannot run here: the CPU lacks an instruction set the
    wheel was built with, or a shared library it needs (the CUDA runtime) is missing."""


# ---- choosing a backend / device ------------------------------------------------------
class BackendError(PolyllamaError, ValueError):
    """A backend/device request that cannot be satisfied."""


class UnknownBackendError(BackendError):
    """A backend name polyllama does not know."""


class BackendNotCompiledError(BackendError):
    """The backend exists but was not compiled into this build."""


class NoDeviceError(BackendError):
    """The backend is compiled in but has no usable device on this machine."""


class DeviceNotFoundError(BackendError):
    """A device index or name that does not exist."""


class ConflictingArgumentsError(PolyllamaError, ValueError):
    """Arguments that contradict each other (e.g. backend="cpu" with n_gpu_layers=10)."""


class InsufficientMemoryError(PolyllamaError, MemoryError):
    """The request does not fit in the free memory of the chosen device(s).

    `needed` and `free` map device names to bytes.
    """

    def __init__(self, message: str = "", *, needed: dict | None = None,
                 free: dict | None = None, log: str = ""):
        super().__init__(message, log=log)
        self.needed = dict(needed or {})
        self.free = dict(free or {})


# ---- loading and running ----------------------------------------------------------------
class ModelLoadError(PolyllamaError):
    """llama.cpp could not load the model file."""


class LoadAbortedError(ModelLoadError):
    """The progress callback stopped loading (returned False). No fallback follows it."""


class ContextError(PolyllamaError):
    """A context could not be created, or it is full."""


class ContextOverflowError(ContextError, ValueError):
    """The prompt does not fit in the context window."""


class DecodeError(PolyllamaError):
    """llama_decode failed."""


class RemoteDeviceError(PolyllamaError, ConnectionError):
    """A ggml RPC server is unreachable, speaks another protocol version, or went away."""


class GrammarError(PolyllamaError, ValueError):
    """An invalid GBNF grammar or JSON schema."""


class TemplateError(PolyllamaError, ValueError):
    """The chat template could not format the messages."""


class ModelFetchError(PolyllamaError):
    """The default model could not be fetched or failed its checksum."""
