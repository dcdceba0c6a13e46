"""The extension's Python surface has no dead ends.

Every public function and class of polyllama._llamacpp (defined in _llamacpp.pyx or the
_engine.pxi it includes) must be used by its Python callers: the package's modules, the
benchmarks or the tests. A def that nothing calls is compiled, documented and kept in step
with llama.cpp for nobody; this test fails until it is used or removed.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()

llamacpp = pytest.importorskip("polyllama._llamacpp")


def public_callables() -> list[str]:
    """Functions and classes that _llamacpp defines itself (not what it imports: errors, re)."""
    return sorted(name for name in dir(llamacpp)
                  if not name.startswith("_")
                  and callable(obj := getattr(llamacpp, name))
                  and getattr(obj, "__module__", None) == llamacpp.__name__)


def caller_files() -> list[Path]:
    files = [*(ROOT / "src" / "polyllama").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
             *(ROOT / "tests").rglob("*.py")]
    return sorted(f for f in files if f.resolve() != THIS)


# the ways callers reach the extension: `llamacpp.NAME` (from ._llamacpp_loader import llamacpp, or
# `import _llamacpp as llamacpp`), `_llamacpp.NAME`, `getattr(llamacpp, "NAME")`,
# `from ..._llamacpp import NAME`
_ATTRIBUTE = re.compile(r"\b_?llamacpp\s*\.\s*([A-Za-z_]\w*)")
_GETATTR = re.compile(r"""getattr\(\s*(?:\w+\.)?_?llamacpp\s*,\s*["']([A-Za-z_]\w*)["']""")
_FROM_IMPORT = re.compile(r"from\s+(?:polyllama|\.*)\s*\.?\s*_llamacpp\s+import\s+(\([^)]*\)|[^\n]+)")


def names_used(text: str) -> set[str]:
    used = set(_ATTRIBUTE.findall(text)) | set(_GETATTR.findall(text))
    for group in _FROM_IMPORT.findall(text):
        for item in re.sub(r"#[^\n]*", "", group).strip("()").split(","):
            if item.strip():
                used.add(item.split()[0])   # `NAME as alias` imports NAME
    return used


def unused(names, files) -> list[str]:
    used = set()
    for f in files:
        used |= names_used(f.read_text(encoding="utf-8", errors="replace"))
    return [n for n in names if n not in used]


def test_every_public_callable_of_the_extension_has_a_caller():
    names = public_callables()
    assert len(names) > 20, names   # the extension was found and its API read
    dead = unused(names, caller_files())
    assert not dead, (
        f"polyllama._llamacpp defines {dead} but no module of src/polyllama, benchmark or test "
        "uses it: remove it (or make it cdef/private if only _llamacpp.pyx needs it)")


def test_the_search_sees_each_way_of_reaching_the_extension():
    text = inspect.cleandoc('''
        from ._llamacpp_loader import llamacpp
        llamacpp.Model(path)
        x = _llamacpp_loader.llamacpp.device_list()
        from polyllama._llamacpp import (ModelParams,  # the parameters
                                     ContextParams as CP)
        from ._llamacpp import Sampler
        getattr(llamacpp, "Engine")
    ''')
    assert names_used(text) >= {"Model", "device_list", "ModelParams", "ContextParams", "Sampler",
                                "Engine"}


def test_an_unused_def_is_reported(tmp_path):
    # what a new `def fresh_helper(): ...` in _llamacpp.pyx that nothing calls would look like
    caller = tmp_path / "caller.py"
    caller.write_text("from ._llamacpp_loader import llamacpp\nllamacpp.Model('m.gguf')\n")
    assert unused(["Model", "fresh_helper"], [caller]) == ["fresh_helper"]
