"""The development environment (buildtools/devenv.py): what a fresh machine gets from `make`.

The names of every requirement are in pyproject.toml and their versions in
requirements-dev.lock; CI (.ci/run) installs nothing itself. These tests read those files
and run the preflight checks for real, with PATH and the compiler variables changed.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVENV = ROOT / "buildtools" / "devenv.py"
sys.path.insert(0, str(DEVENV.parent))
import devenv  # noqa: E402


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")


def _locked() -> dict:
    out = {}
    for line in (ROOT / "requirements-dev.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[name.lower().replace("_", "-")] = version
    return out


def test_requirements_come_from_pyproject():
    reqs = devenv.requirements()
    names = [_name(r) for r in reqs]
    # the build requirements and both extras, in that order, no duplicates
    assert names[:3] == ["scikit-build-core", "cython", "ninja"]
    for n in ("pytest", "hypothesis", "gguf", "openai", "starlette", "uvicorn", "pydantic"):
        assert n in names
    assert len(names) == len(set(names))


def test_every_requirement_is_pinned_in_the_lock():
    locked = _locked()
    for req in devenv.requirements():
        assert _name(req) in locked, f"{req} is not in requirements-dev.lock (run `make lock`)"
    assert devenv.lock_python() is not None


def test_fallback_toml_reader_matches_tomllib():
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib  # noqa: F401
    except ImportError:
        return
    real = devenv._toml_arrays(text)
    saved = sys.modules.get("tomllib")
    sys.modules["tomllib"] = None    # what Python < 3.11 sees
    try:
        fallback = devenv._toml_arrays(text)
    finally:
        if saved is not None:
            sys.modules["tomllib"] = saved
        else:
            del sys.modules["tomllib"]
    for key in ("build-system.requires", "project.optional-dependencies.test",
                "project.optional-dependencies.server"):
        assert fallback[key] == real[key]


def _check(env_changes: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env.update(env_changes)
    return subprocess.run([sys.executable, str(DEVENV), "--check"], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)


def test_preflight_passes_here():
    out = _check({})
    assert out.returncode == 0, out.stderr


def test_preflight_names_missing_cmake_and_compilers(tmp_path):
    # a PATH with nothing on it: no cmake, no cc/c++ (the interpreter is called by path)
    out = _check({"PATH": str(tmp_path)})
    assert out.returncode == 2
    assert "CMake >= 3.21 is missing: install cmake" in out.stderr
    assert "no C compiler" in out.stderr and "install build-essential" in out.stderr
    assert "no C++ compiler" in out.stderr


def test_preflight_rejects_old_cmake(tmp_path):
    fake = tmp_path / "cmake"
    fake.write_text("#!/bin/sh\necho 'cmake version 3.18.4'\n")
    fake.chmod(0o755)
    out = _check({"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert out.returncode == 2
    assert "CMake >= 3.21 is needed" in out.stderr and "3.18.4" in out.stderr


def test_preflight_honours_cc_variable(tmp_path):
    out = _check({"CC": str(tmp_path / "no-such-cc")})
    assert out.returncode == 2
    assert f"$CC={tmp_path / 'no-such-cc'}" in out.stderr


def test_ci_installs_no_python_package():
    ci = (ROOT / ".ci" / "run").read_text()
    code = "\n".join(line for line in ci.splitlines() if not line.lstrip().startswith("#"))
    assert "pip install" not in code and "pip3 install" not in code
    # the README's two commands, in an environment whose only Python is Debian's
    assert "make run" in code and "make test" in code
    assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in code and "env -i" in code


def test_readme_names_the_apt_line_and_ci_installs_it():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"apt-get install ([^\n`]+)", readme)
    assert m, "README.md names no apt line"
    packages = m.group(1).split()
    assert {"build-essential", "cmake", "python3-dev", "python3-venv", "git"} <= set(packages)
    ci = (ROOT / ".ci" / "run").read_text()
    for p in packages:
        assert p in ci, f"README's {p} is not installed by .ci/run"
    # README starts with the two commands
    first_block = readme.split("```")[1]
    assert "make run" in first_block and "make test" in first_block


def test_devenv_off_uses_an_environment_as_it_is(tmp_path):
    env = dict(os.environ, POLYLLAMA_DEVENV="off")
    # an environment with Cython and ninja: accepted, nothing installed. This interpreter's
    # own, except under `make test-wheel`, whose venv holds the wheel and not the build
    # tools: then make's .venv, which that target made first.
    prefix = Path(sys.prefix)
    if importlib.util.find_spec("Cython") is None:
        prefix = DEVENV.parent.parent / ".venv"
    out = subprocess.run([sys.executable, str(DEVENV), str(prefix)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(prefix / "bin" / "python")
    assert not (prefix / devenv.STAMP).exists() or "installing" not in out.stderr
    # a missing environment is an error that says how to point at one
    out = subprocess.run([sys.executable, str(DEVENV), str(tmp_path / "nothing")], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert out.returncode == 2
    assert "POLYLLAMA_DEVENV=off uses an existing environment" in out.stderr
