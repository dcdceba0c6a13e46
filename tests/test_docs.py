"""The documentation, executed and cross-checked against the code.

* Every ```python block in docs/*.md and README.md that is marked runnable by an HTML
  comment line `<!-- test -->` right before its fence is run in-process, in a fresh
  namespace, one test per block (id: FILE#INDEX). A block that raises fails its test.
  Tracebacks point at the Markdown file's own line numbers.
* Every make target named in README's "Make targets" table must exist: `make -n TARGET`
  succeeds.
* Every environment variable in README's "Environment variables" table must be read or
  mentioned by the code (src/, scripts/, Makefile, CMakeLists.txt); the few that belong to
  someone else (vendor runtimes, the test suite) must be explained where READ_ELSEWHERE says.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
MARKER = "<!-- test -->"
FENCE_OPEN = "```python"
FENCE_CLOSE = "```"


# --------------------------------------------------------------------------------------
# runnable blocks
# --------------------------------------------------------------------------------------

def _scan(path: Path):
    """(blocks, problems): blocks are (index, first code line number, code) per marked block;
    problems are markers not followed by a closed ```python fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, problems = [], []
    i = 0
    while i < len(lines):
        if lines[i].strip() != MARKER:
            i += 1
            continue
        marker_line = i + 1
        if i + 1 >= len(lines) or lines[i + 1].strip() != FENCE_OPEN:
            problems.append(f"{path.name}:{marker_line}: {MARKER} is not followed by a {FENCE_OPEN} fence")
            i += 1
            continue
        start = i + 2
        end = start
        while end < len(lines) and lines[end].strip() != FENCE_CLOSE:
            end += 1
        if end >= len(lines):
            problems.append(f"{path.name}:{marker_line}: the {FENCE_OPEN} fence is never closed")
            break
        blocks.append((len(blocks), start + 1, "\n".join(lines[start:end]) + "\n"))
        i = end + 1
    return blocks, problems


def _collect():
    out = []
    for path in DOC_FILES:
        if path.is_file():
            rel = path.relative_to(ROOT).as_posix()
            for index, lineno, code in _scan(path)[0]:
                out.append(pytest.param(rel, lineno, code, id=f"{rel}#{index}"))
    return out


BLOCKS = _collect()


def test_markers_are_well_formed():
    problems = [p for path in DOC_FILES if path.is_file() for p in _scan(path)[1]]
    assert not problems, "\n".join(problems)


def test_docs_have_runnable_examples():
    files = {p.values[0] for p in BLOCKS}
    for name in ("ARCHITECTURE.md", "BUILD_BACKENDS.md", "CHOOSING_A_DEVICE.md", "API.md"):
        assert f"docs/{name}" in files, f"docs/{name} has no {MARKER} block"


def _close_leftovers(namespace: dict) -> None:
    """Free models a block left open (its LLM / Tokenizer objects), so blocks stay independent."""
    for value in list(namespace.values()):
        module = type(value).__module__ or ""
        if module.startswith("polyllama") and callable(getattr(value, "close", None)):
            try:
                value.close()
            except Exception:
                pass


@pytest.mark.parametrize("rel,lineno,code", BLOCKS)
def test_runnable_block(rel, lineno, code):
    # Leading newlines make the compiled code's line numbers those of the Markdown file.
    compiled = compile("\n" * (lineno - 1) + code, str(ROOT / rel), "exec")
    namespace = {"__name__": "__docs__"}
    try:
        exec(compiled, namespace)
    finally:
        _close_leftovers(namespace)


# --------------------------------------------------------------------------------------
# README tables
# --------------------------------------------------------------------------------------

def _readme_table(section: str) -> list[list[str]]:
    """The body rows (cells) of the first table under README's '## <section>' heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(section)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README.md has no '## {section}' section"
    rows = []
    for line in m.group(1).splitlines():
        line = line.strip()
        if not line.startswith("|"):
            if rows:
                break          # the table ended
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue           # the separator row
        rows.append(cells)
    return rows[1:]            # drop the header row


def _readme_make_targets() -> list[str]:
    targets = []
    for cells in _readme_table("Make targets"):
        # first column: `make run`, or `make build-cuda` `build-hip` ...; elsewhere: `make reset`
        for tok in re.findall(r"`([^`]+)`", cells[0]):
            targets.append(tok[len("make "):] if tok.startswith("make ") else tok)
        for tok in re.findall(r"`make ([^`]+)`", " ".join(cells[1:])):
            targets.append(tok)
    return list(dict.fromkeys(t.strip() for t in targets))


MAKE_TARGETS = _readme_make_targets()


def test_readme_make_targets_parsed():
    assert {"run", "test", "build", "build-cpu", "build-cuda", "clean", "reset"} <= set(MAKE_TARGETS)
    for t in MAKE_TARGETS:
        assert re.fullmatch(r"[a-z][a-z0-9-]*", t), f"odd make target {t!r} in README's table"


@pytest.mark.parametrize("target", MAKE_TARGETS)
def test_readme_make_target_exists(target):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_") and k != "CMAKE_ARGS"}
    r = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, f"make -n {target} failed:\n{r.stderr[-2000:]}"


def _readme_env_vars() -> list[str]:
    names = []
    for cells in _readme_table("Environment variables"):
        names += [tok for tok in re.findall(r"`([^`]+)`", cells[0]) if re.fullmatch(r"[A-Z][A-Z0-9_]+", tok)]
    return list(dict.fromkeys(names))


ENV_VARS = _readme_env_vars()

# Where the code looks for a variable's name. Generated files (build_info.json, *.so) are
# not sources, so only these suffixes count.
CODE_PATHS = [ROOT / "src", ROOT / "buildtools", ROOT / "cmake", ROOT / "scripts", ROOT / "Makefile",
              ROOT / "CMakeLists.txt"]
CODE_SUFFIXES = {".py", ".pyx", ".pxd", ".pxi", ".h", ".hpp", ".c", ".cpp", ".sh", ".cmake", ".txt", ""}

# README variables that polyllama's code does not read, and the file that must explain them.
READ_ELSEWHERE = {
    "POLYLLAMA_TOOLS_DIR": "tests/conftest.py",              # the test suite's own setting
    "CUDA_VISIBLE_DEVICES": "docs/CHOOSING_A_DEVICE.md",     # the CUDA runtime's
    "HIP_VISIBLE_DEVICES": "docs/CHOOSING_A_DEVICE.md",      # the ROCm/HIP runtime's
    "ONEAPI_DEVICE_SELECTOR": "docs/CHOOSING_A_DEVICE.md",   # the oneAPI SYCL runtime's
}


@functools.lru_cache(maxsize=1)
def _code_text() -> str:
    parts = []
    for base in CODE_PATHS:
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix not in CODE_SUFFIXES:
                continue
            parts.append(f.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def test_readme_env_vars_parsed():
    assert {"GGML_CUDA", "GGML_AUTO", "CMAKE_ARGS", "POLYLLAMA_CACHE_DIR", "POLYLLAMA_BACKEND"} <= set(ENV_VARS)


@pytest.mark.parametrize("var", ENV_VARS)
def test_readme_env_var_is_used(var):
    if re.search(rf"\b{re.escape(var)}\b", _code_text()):
        return
    where = READ_ELSEWHERE.get(var)
    assert where, (f"README documents {var}, but nothing in src/, buildtools/, cmake/, scripts/, "
                   "Makefile or CMakeLists.txt mentions it")
    assert var in (ROOT / where).read_text(encoding="utf-8"), f"{var} should be explained in {where}"


# --------------------------------------------------------------------------------------
# links between the documents
# --------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_relative_links_resolve():
    broken = []
    for path in DOC_FILES:
        text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# --------------------------------------------------------------------------------------
# ARCHITECTURE.md's map of the package
# --------------------------------------------------------------------------------------

PACKAGE = ROOT / "src" / "polyllama"
SOURCE_SUFFIXES = (".py", ".pyx", ".pxi", ".pxd", ".cpp", ".h")


def _architecture_layers_text() -> str:
    """Section 1 of ARCHITECTURE.md: the layer map and the tables of every layer."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    m = re.search(r"^## 1\. Layers\s*$(.*?)(?=^## 2\.)", text, re.M | re.S)
    assert m, "ARCHITECTURE.md has no '## 1. Layers' section"
    return m.group(1)


def _package_sources() -> list[str]:
    """Every source file of the package, relative to src/polyllama (package markers aside)."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
                  if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts
                  and p.name not in ("__init__.py", "__init__.pxd", "__main__.py"))


def test_architecture_names_every_module_of_the_package():
    section = _architecture_layers_text()
    missing = [rel for rel in _package_sources()
               if not re.search(rf"(?<![\w.]){re.escape(Path(rel).stem)}\.(\{{[^}}]*\}}|{re.escape(Path(rel).suffix[1:])})",
                                section)]
    assert not missing, f"ARCHITECTURE.md §1 does not name: {', '.join(missing)}"


def test_architecture_names_no_module_that_is_gone():
    section = _architecture_layers_text()
    named = set(re.findall(r"(?<![\w./-])([A-Za-z_][\w]*\.(?:pyx|pxi|pxd|py))\b", section))
    everywhere = {p.name for p in ROOT.rglob("*") if p.suffix in SOURCE_SUFFIXES
                  and "thirdparty" not in p.parts and ".venv" not in p.parts and "build" not in p.parts}
    gone = sorted(n for n in named if n not in everywhere)
    assert not gone, f"ARCHITECTURE.md §1 names files that do not exist: {', '.join(gone)}"
