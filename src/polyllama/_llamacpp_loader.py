"""The compiled extension, polyllama._llamacpp, as `llamacpp`; or, where it was not built, an
ExtensionNotBuiltError that says how to build it (instead of a bare ImportError)."""
from __future__ import annotations

from .errors import ExtensionNotBuiltError

try:
    from . import _llamacpp  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only in unbuilt trees
    raise ExtensionNotBuiltError(
        "polyllama's compiled extension (polyllama._llamacpp) is not built: run `make build` "
        "(or `GGML_<BACKEND>=1 make build`) in the source tree, or `pip install .`; "
        f"import error: {e}") from e

llamacpp = _llamacpp
