"""Import of the compiled extension with a helpful error when it was not built."""
from __future__ import annotations

from .errors import ExtensionNotBuiltError

try:
    from . import _core  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only in unbuilt trees
    raise ExtensionNotBuiltError(
        "polyllama's compiled extension (polyllama._core) is not built: run `make build` "
        "(or `GGML_<BACKEND>=1 make build`) in the source tree, or `pip install .`; "
        f"import error: {e}") from e

core = _core
