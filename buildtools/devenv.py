#!/usr/bin/env python3
"""The project's virtual environment: what `make` builds and tests with.

    python3 buildtools/devenv.py [VENV]      make VENV ready, print its python on stdout
    python3 buildtools/devenv.py --check     only the preflight checks (nothing installed)
    python3 buildtools/devenv.py --lock      re-resolve requirements-dev.lock in a scratch venv

The Makefile runs this first, with whatever `python3` is on PATH (on a fresh Debian 12
that is /usr/bin/python3: nothing pip-installed, "externally managed"). It

1. checks, before anything is downloaded or compiled, what pip cannot provide: Python
   >= 3.9 with its headers (python3-dev), the venv module (python3-venv), a C and a C++
   compiler (build-essential) and CMake >= 3.21, each failure naming the package;
2. creates VENV (default .venv; the active one when $VIRTUAL_ENV is set) unless it exists;
3. installs into it what pyproject.toml declares, and nothing else: the build
   requirements ([build-system] requires), the `test` and `server` extras and the `dist`
   dependency group (wheels), with the exact versions of requirements-dev.lock as constraints;
4. writes a stamp holding a digest of pyproject.toml and the lock, so the next run
   returns at once unless either changed.

The names live in pyproject.toml, the versions in requirements-dev.lock: there is no
other list (CI installs nothing itself; it runs `make run` and `make test`).

POLYLLAMA_DEVENV=off (a machine without network, e.g. the GPU machines): install
nothing; use VENV (or $VIRTUAL_ENV) as it is, after checking that its python imports
what building needs (Cython, ninja).
Only the standard library is used, so this runs on any Python >= 3.9.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements-dev.lock"
STAMP = ".polyllama-devenv"
EXTRAS = ("test", "server")
GROUPS = ("dist",)
MIN_PYTHON = (3, 9)
MIN_CMAKE = (3, 21)
APT_HINT = "sudo apt-get install build-essential cmake git python3-dev python3-venv"
PREFIX = "polyllama devenv"


class DevenvError(Exception):
    pass


# ---- what pyproject.toml declares -----------------------------------------------------------
def _toml_arrays(text: str) -> dict:
    """{"table.key": [str, ...]} for the string arrays of a TOML file.

    tomllib (Python >= 3.11) reads the file when it exists; older Pythons get this small
    reader, which knows only what pyproject.toml's requirement lists use: [tables],
    `key = [` string arrays over one or more lines, and comments.
    """
    try:
        import tomllib
    except ImportError:
        tomllib = None
    if tomllib is not None:
        out: dict = {}

        def walk(prefix, table):
            for k, v in table.items():
                name = f"{prefix}.{k}" if prefix else k
                if isinstance(v, dict):
                    walk(name, v)
                elif isinstance(v, list) and all(isinstance(x, str) for x in v):
                    out[name] = v
        walk("", tomllib.loads(text))
        return out
    out, table, key, buf = {}, "", None, ""
    for raw in text.splitlines():
        line = _strip_comment(raw).strip()
        if key is None:
            m = re.match(r"^\[([^\]]+)\]$", line)
            if m:
                table = m.group(1).strip()
                continue
            m = re.match(r'^("?[\w.-]+"?)\s*=\s*\[(.*)$', line)
            if not m:
                continue
            key, buf = m.group(1).strip('"'), m.group(2)
        else:
            buf += " " + line
        if "]" in buf:
            out[f"{table}.{key}" if table else key] = re.findall(r'"([^"]*)"', buf.split("]")[0])
            key = None
    return out


def _strip_comment(line: str) -> str:
    """line without a trailing # comment (a # inside a "string" is kept)."""
    quoted = False
    for i, c in enumerate(line):
        if c == '"':
            quoted = not quoted
        elif c == "#" and not quoted:
            return line[:i]
    return line


def requirements() -> list[str]:
    """Build requirements, the development extras and groups, as pyproject.toml writes them."""
    arrays = _toml_arrays(PYPROJECT.read_text(encoding="utf-8"))
    reqs = list(arrays.get("build-system.requires", []))
    for extra in EXTRAS:
        name = f"project.optional-dependencies.{extra}"
        if name not in arrays:
            raise DevenvError(f"pyproject.toml has no [project.optional-dependencies] {extra}")
        reqs += arrays[name]
    for group in GROUPS:
        name = f"dependency-groups.{group}"
        if name not in arrays:
            raise DevenvError(f"pyproject.toml has no [dependency-groups] {group}")
        reqs += arrays[name]
    return list(dict.fromkeys(reqs))


def digest() -> str:
    h = hashlib.sha256()
    for path in (PYPROJECT, LOCK, Path(__file__)):
        h.update(path.read_bytes() if path.is_file() else b"-")
    return h.hexdigest()


def lock_python() -> str | None:
    """The 'major.minor' Python version the lock was resolved with (its header says)."""
    if not LOCK.is_file():
        return None
    m = re.search(r"^# python: (\d+\.\d+)", LOCK.read_text(encoding="utf-8"), re.M)
    return m.group(1) if m else None


# ---- preflight: what pip cannot install ---------------------------------------------------
def _version_tuple(text: str) -> tuple:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x or 0) for x in m.groups()) if m else ()


def preflight(need_venv_module: bool) -> list[str]:
    """Problems that would stop the build later, each with the package that fixes it."""
    problems = []
    if sys.version_info < MIN_PYTHON:
        problems.append(f"Python {'.'.join(map(str, MIN_PYTHON))} or newer is needed, this is "
                        f"{sys.version.split()[0]} ({sys.executable})")
    include = sysconfig.get_paths().get("include") or ""
    if not os.path.isfile(os.path.join(include, "Python.h")):
        problems.append(f"Python's C headers are missing ({include}/Python.h): install python3-dev "
                        f"(python{sys.version_info[0]}.{sys.version_info[1]}-dev)")
    if need_venv_module:
        try:
            import ensurepip  # noqa: F401  (Debian splits it out of python3 into python3-venv)
            import venv       # noqa: F401
        except ImportError:
            problems.append("Python's venv module (with ensurepip) is missing: install python3-venv")
    for var, names, what in (("CC", ("cc", "gcc", "clang"), "C"), ("CXX", ("c++", "g++", "clang++"), "C++")):
        given = os.environ.get(var)
        found = shutil.which(given.split()[0]) if given else next(
            (shutil.which(n) for n in names if shutil.which(n)), None)
        if not found:
            problems.append(f"no {what} compiler ({'$' + var + '=' + given if given else ', '.join(names)} "
                            "not found): install build-essential")
    cmake = shutil.which("cmake")
    if not cmake:
        problems.append(f"CMake >= {'.'.join(map(str, MIN_CMAKE))} is missing: install cmake")
    else:
        try:
            out = subprocess.run([cmake, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as e:
            out = str(e)
        v = _version_tuple(out)
        if not v or v[:2] < MIN_CMAKE:
            problems.append(f"CMake >= {'.'.join(map(str, MIN_CMAKE))} is needed, {cmake} is "
                            f"{'.'.join(map(str, v)) or 'unreadable'}: install a newer cmake")
    return problems


# ---- the environment ----------------------------------------------------------------------
def _run(argv: list[str], what: str) -> None:
    print(f"{PREFIX}: {what}", file=sys.stderr, flush=True)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise DevenvError(f"{what} failed ({' '.join(argv)}):\n{proc.stdout[-3000:]}")


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


BUILD_MODULES = ("Cython", "ninja")


def use_as_is(venv: Path) -> Path:
    """POLYLLAMA_DEVENV=off: check, install nothing."""
    py = venv_python(venv)
    problems = preflight(need_venv_module=False)
    if not py.exists():
        problems.append(f"{py} does not exist (POLYLLAMA_DEVENV=off uses an existing environment: "
                        "set VIRTUAL_ENV or VENV)")
    else:
        code = ("import importlib.util as u, sys; missing = [m for m in sys.argv[1:] if not u.find_spec(m)]; "
                "sys.exit(','.join(missing) if missing else 0)")
        proc = subprocess.run([str(py), "-c", code, *BUILD_MODULES], stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            problems.append(f"{py} lacks {proc.stderr.strip()} (needed to build; install them there)")
    if problems:
        raise DevenvError("POLYLLAMA_DEVENV=off, and the environment cannot build:\n  - " + "\n  - ".join(problems))
    return py


def ensure(venv: Path) -> Path:
    """Make venv hold the development requirements; return its python."""
    if os.environ.get("POLYLLAMA_DEVENV", "").lower() in ("off", "0", "no"):
        return use_as_is(venv)
    py = venv_python(venv)
    problems = preflight(need_venv_module=not py.exists())
    if problems:
        raise DevenvError("this machine cannot build polyllama yet:\n  - " + "\n  - ".join(problems)
                          + f"\nOn Debian/Ubuntu: {APT_HINT}")
    stamp = venv / STAMP
    want = digest()
    if py.exists() and stamp.is_file() and stamp.read_text().strip() == want:
        return py
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv)], f"creating the virtual environment {venv}")
    reqs = requirements()
    args = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    locked = lock_python()
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    py_here = subprocess.run([str(py), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             stdout=subprocess.PIPE, text=True).stdout.strip() or here
    if locked == py_here:
        args += ["-c", str(LOCK)]
    else:
        print(f"{PREFIX}: warning: requirements-dev.lock was resolved for Python {locked}, this is "
              f"{py_here}: installing the newest versions pyproject.toml allows", file=sys.stderr)
    _run(args + reqs, f"installing {len(reqs)} requirements from pyproject.toml into {venv} "
                      "(build tools, test and server extras)")
    stamp.write_text(want + "\n")
    return py


def relock() -> None:
    """Resolve pyproject.toml's requirements afresh and write requirements-dev.lock."""
    with tempfile.TemporaryDirectory(prefix="polyllama-lock-") as tmp:
        venv = Path(tmp) / "venv"
        _run([sys.executable, "-m", "venv", str(venv)], "creating a scratch environment")
        py = venv_python(venv)
        reqs = requirements()
        _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", *reqs],
             f"resolving {len(reqs)} requirements")
        frozen = subprocess.run([str(py), "-m", "pip", "freeze", "--all", "--exclude", "pip",
                                 "--exclude", "setuptools", "--exclude", "wheel"],
                                stdout=subprocess.PIPE, text=True, check=True).stdout
    LOCK.write_text(
        "# Exact versions for the development environment (make's .venv), used as pip constraints\n"
        "# by buildtools/devenv.py. The requirement names are in pyproject.toml; regenerate with\n"
        "# `make lock` after changing them.\n"
        f"# python: {sys.version_info[0]}.{sys.version_info[1]}\n" + frozen)
    print(f"{PREFIX}: wrote {LOCK}", file=sys.stderr)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--check"]:
            problems = preflight(need_venv_module=True)
            for p in problems:
                print(f"{PREFIX}: {p}", file=sys.stderr)
            return 2 if problems else 0
        if argv[:1] == ["--lock"]:
            relock()
            return 0
        if argv[:1] in (["-h"], ["--help"]):
            print(__doc__)
            return 0
        env_venv = os.environ.get("VIRTUAL_ENV")
        venv = Path(argv[0] if argv else (env_venv or ROOT / ".venv")).absolute()
        print(ensure(venv))
        return 0
    except DevenvError as e:
        print(f"{PREFIX}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
