#!/usr/bin/env python3
"""Obtain the pinned llama.cpp source tree.

The pin (thirdparty/llama.cpp.pin.json) names a PyPI sdist whose vendor/llama.cpp
directory is the llama.cpp tree polyllama builds against. This script downloads that
sdist with pip, checks its sha256, and unpacks the subtree into thirdparty/llama.cpp.
The unpacked tree carries a stamp file; a changed pin re-fetches.

The patches in thirdparty/patches/ (a short, documented series; each file says why) are
applied in name order with GNU patch before the tree is put in place; the stamp records
them, so a changed or added patch re-unpacks the tree.

With LLAMA_CPP_DIR=/path set (or --llama-cpp-dir), an existing tree is validated and
used instead; nothing is downloaded and nothing is patched.

Nothing half-done is left behind: the tree is unpacked into a temporary directory next
to the destination and renamed into place only after every check passed.

Prints the path of the tree on the last line of stdout; exits 1 with a message on error.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN_FILE = ROOT / "thirdparty" / "llama.cpp.pin.json"
PATCH_DIR = ROOT / "thirdparty" / "patches"
DEFAULT_DEST = ROOT / "thirdparty" / "llama.cpp"
STAMP_NAME = ".polyllama-pin.json"
# Files whose presence makes a directory a llama.cpp tree we can build.
REQUIRED_FILES = ("CMakeLists.txt", "include/llama.h", "ggml/include/ggml-backend.h",
                  "common/fit.h", "src/llama.cpp")


class FetchError(Exception):
    pass


def cache_dir() -> Path:
    base = os.environ.get("POLYLLAMA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polyllama")
    return Path(base)


def load_pin(path: Path = PIN_FILE) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def validate_tree(path: Path) -> None:
    if not path.is_dir():
        raise FetchError(f"{path} is not a directory")
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise FetchError(f"{path} is not a llama.cpp source tree: missing {', '.join(missing)}")


def patch_files(patch_dir: Path = PATCH_DIR) -> list[Path]:
    return sorted(patch_dir.glob("*.patch")) if patch_dir.is_dir() else []


def expected_stamp(pin: dict, patch_dir: Path = PATCH_DIR) -> dict:
    """What the unpacked tree's stamp says: the pin, and the patches applied to it."""
    return dict(pin, patches={p.name: sha256_of(p) for p in patch_files(patch_dir)})


def apply_patches(tree: Path, patch_dir: Path = PATCH_DIR) -> None:
    patches = patch_files(patch_dir)
    if not patches:
        return
    tool = shutil.which("patch")
    if tool is None:
        raise FetchError("GNU patch is needed to apply thirdparty/patches (apt-get install patch; "
                         "it comes with build-essential)")
    for p in patches:
        proc = subprocess.run([tool, "-p1", "--forward", "--batch", "--no-backup-if-mismatch",
                               "--reject-file=-", "-d", str(tree), "-i", str(p)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise FetchError(f"{p.name} does not apply to the pinned tree:\n{proc.stdout[-2000:]}")


def download_sdist(pin: dict, into: Path) -> Path:
    """Download the pinned sdist with pip into `into` (a cache dir) and return its path."""
    name = pin["sdist_package"].replace("-", "_")
    version = pin["sdist_version"]
    into.mkdir(parents=True, exist_ok=True)
    existing = into / f"{name}-{version}.tar.gz"
    if existing.is_file() and sha256_of(existing) == pin["sdist_sha256"]:
        return existing
    print(f"fetch_llama_cpp: downloading {pin['sdist_package']}=={version} sdist with pip ...",
          file=sys.stderr, flush=True)
    # --no-build-isolation: pip prepares the sdist's metadata with the scikit-build-core
    # already installed here; with isolation, --no-binary :all: would also apply to the
    # build requirements and compile CMake from source.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "-d", str(into), f"{pin['sdist_package']}=={version}"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise FetchError("pip download failed (is PyPI reachable? is scikit-build-core "
                         "installed?):\n" + proc.stdout[-3000:])
    if not existing.is_file():
        raise FetchError(f"pip download succeeded but {existing.name} is not in {into}")
    return existing


def unpack(sdist: Path, pin: dict, dest: Path, patch_dir: Path = PATCH_DIR) -> None:
    digest = sha256_of(sdist)
    if digest != pin["sdist_sha256"]:
        raise FetchError(f"sha256 mismatch for {sdist.name}: expected {pin['sdist_sha256']}, "
                         f"got {digest}; refusing to unpack")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".llama.cpp.partial-", dir=dest.parent))
    try:
        prefix = None
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar.getmembers():
                parts = m.name.split("/", 1)
                if len(parts) < 2:
                    continue
                prefix = parts[0]
                rel = parts[1]
                sub = pin["subdir"].rstrip("/") + "/"
                if rel.startswith(sub):
                    m.name = rel[len(sub):]
                    # the sdist keeps llama.cpp's submodule pointer (.git); it points
                    # outside the tree and makes llama.cpp's git version probe fail noisily
                    if m.name == ".git" or m.name.startswith(".git/"):
                        continue
                    if m.name and (m.isfile() or m.isdir() or m.issym()):
                        members.append(m)
            if not members:
                raise FetchError(f"{sdist.name} has no {pin['subdir']} directory")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:
                # Python < 3.11.4 (Debian 12 has 3.11.2) has no extraction filters:
                # refuse what the "data" filter would refuse, then extract
                for m in members:
                    _check_member(m, tmp)
                tar.extractall(tmp, members=members)
        validate_tree(tmp)
        apply_patches(tmp, patch_dir)
        (tmp / STAMP_NAME).write_text(json.dumps(expected_stamp(pin, patch_dir), indent=2, sort_keys=True) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_member(m: tarfile.TarInfo, root: Path) -> None:
    """What tarfile's "data" filter refuses: absolute names, names or links that leave
    root, devices and other special files."""
    target = (root / m.name).resolve()
    if os.path.isabs(m.name) or not str(target).startswith(str(root.resolve()) + os.sep):
        raise FetchError(f"refusing to unpack {m.name!r}: outside the destination")
    if m.issym():
        link = (target.parent / m.linkname).resolve()
        if os.path.isabs(m.linkname) or not str(link).startswith(str(root.resolve()) + os.sep):
            raise FetchError(f"refusing to unpack the link {m.name!r} -> {m.linkname!r}: it leaves the tree")
    elif not (m.isfile() or m.isdir()):
        raise FetchError(f"refusing to unpack {m.name!r}: not a regular file, directory or link")


def stamp_matches(dest: Path, pin: dict, patch_dir: Path = PATCH_DIR) -> bool:
    try:
        stamp = json.loads((dest / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    return stamp == expected_stamp(pin, patch_dir)


def ensure_llama_cpp(dest: Path = DEFAULT_DEST, sdist: Path | None = None,
                     llama_cpp_dir: str | None = None, pin_file: Path = PIN_FILE,
                     patch_dir: Path = PATCH_DIR) -> Path:
    if llama_cpp_dir:
        path = Path(llama_cpp_dir).expanduser().resolve()
        validate_tree(path)
        return path
    pin = load_pin(pin_file)
    if sdist is None and dest.is_dir() and stamp_matches(dest, pin, patch_dir):
        return dest
    if sdist is None:
        if (ROOT / "PKG-INFO").is_file():
            # an unpacked polyllama sdist carries the tree; building one must not go online
            raise FetchError(f"this polyllama sdist should carry the pinned llama.cpp in {dest}, "
                             "but it is missing or does not match thirdparty/llama.cpp.pin.json; "
                             "nothing is downloaded while building an sdist (get a complete one, "
                             "or set LLAMA_CPP_DIR to a llama.cpp tree)")
        sdist = download_sdist(pin, cache_dir() / "sdist")
    unpack(Path(sdist), pin, dest, patch_dir)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="where to unpack (default: %(default)s)")
    ap.add_argument("--sdist", type=Path, help="use this local sdist file instead of downloading")
    ap.add_argument("--pin", type=Path, default=PIN_FILE, help="pin file (default: %(default)s)")
    ap.add_argument("--patches", type=Path, default=PATCH_DIR,
                    help="directory of *.patch files applied in name order (default: %(default)s)")
    ap.add_argument("--llama-cpp-dir", default=os.environ.get("LLAMA_CPP_DIR") or None,
                    help="use an existing llama.cpp tree (default: $LLAMA_CPP_DIR)")
    args = ap.parse_args(argv)
    try:
        path = ensure_llama_cpp(args.dest, args.sdist, args.llama_cpp_dir, args.pin, args.patches)
    except FetchError as e:
        print(f"fetch_llama_cpp: error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
