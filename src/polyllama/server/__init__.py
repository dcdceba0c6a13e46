"""`polyllama serve`: an OpenAI-compatible HTTP server on the LLM's sequence engine.

Why this package: the server's code needs the optional extra `polyllama[server]`
(Starlette, uvicorn, pydantic); keeping it in its own package means `import polyllama`
never needs them, and importing this package without them says what to install.

    from polyllama import LLM
    from polyllama.server import create_app      # an ASGI app: run it with uvicorn
    app = create_app(LLM(n_seq_max=8), model_alias="smollm2")

Layout: schemas.py (request models, the OpenAI error shape), bridge.py (the engine thread
and the event loop), app.py (routes and the app factory), metrics.py (Prometheus text).
The command line is `serve` in polyllama/cli.py. docs/SERVER.md is the user's guide.
"""
from __future__ import annotations

from ..errors import PolyllamaError

_EXTRA = ("starlette", "uvicorn", "pydantic")


class ServerExtraMissing(PolyllamaError, ImportError):
    """A package of the `polyllama[server]` extra is not installed."""


def _check_extra() -> None:
    import importlib
    missing = []
    for name in _EXTRA:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ServerExtraMissing(
            f"polyllama serve needs the server extra, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: pip install 'polyllama[server]' "
            "(or: pip install starlette uvicorn pydantic)")


_check_extra()

from .app import create_app  # noqa: E402

__all__ = ["create_app", "ServerExtraMissing"]
