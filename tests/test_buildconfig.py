"""buildtools/buildconfig.py: flags, SDK detection and the CLI, against fake SDK layouts.

Nothing of the real machine is consulted: every test passes an `env` mapping whose PATH
holds only a temp bin dir, and POLYLLAMA_FAKE_ROOT / POLYLLAMA_FAKE_PLATFORM point the
fixed system paths (/usr/include, /opt/rocm, /dev/kfd, ...) and the platform at a temp
tree. Fake tools are `#!/bin/sh` scripts using only shell builtins, so they need no PATH.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buildtools import buildconfig as bc
from polyllama.backend_table import AUTO_ORDER, BACKENDS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "buildtools" / "buildconfig.py"
TABLE = ROOT / "src" / "polyllama" / "backend_table.py"
FLAGS = tuple(b.flag for b in BACKENDS if b.name != "cpu")


# --------------------------------------------------------------------------------------
# fake layouts
# --------------------------------------------------------------------------------------

def write_tool(path: Path, output: str = "", rc: int = 0, script: str | None = None) -> Path:
    """An executable /bin/sh script printing `output` and exiting with `rc`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if script is None:
        quoted = "'" + output.replace("'", "'\\''") + "'"
        script = f"printf '%s\\n' {quoted}\nexit {rc}\n"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class Fake:
    """A fake machine: env mapping, a bin dir on its PATH and a fake root."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.root = tmp / "root"
        self.cache = tmp / "cache"
        for d in (self.bin, self.root, self.cache, tmp / "home"):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": str(self.bin),
            "HOME": str(tmp / "home"),
            "POLYLLAMA_FAKE_ROOT": str(self.root),
            "POLYLLAMA_CACHE_DIR": str(self.cache),
            "POLYLLAMA_FAKE_PLATFORM": "linux",
        }

    def at(self, system_path: str) -> Path:
        """Where the fixed system path lives in this fake machine."""
        return self.root / system_path.lstrip("/")

    def tool(self, name: str, output: str = "", rc: int = 0, script: str | None = None) -> Path:
        return write_tool(self.bin / name, output, rc, script)

    # --- SDK layouts used by several tests ---
    def cuda_toolkit(self, where: Path, release: str = "12.4") -> Path:
        write_tool(where / "bin" / "nvcc", "nvcc: NVIDIA (R) Cuda compiler driver\n"
                   f"Cuda compilation tools, release {release}, V{release}.131\n"
                   f"Build cuda_{release}.r{release}/compiler.34097967_0")
        touch(where / "include" / "cuda_runtime.h")
        return where

    def nvidia_smi(self, *rows: str) -> Path:
        return self.tool("nvidia-smi", "\n".join(rows or ("NVIDIA H100 80GB HBM3, 9.0",)))

    def rocm(self, hipblas: bool = True, rocblas: bool = True, version_output: str | None = None) -> Path:
        """AMD's layout in /opt/rocm (the BLAS flags drop the libraries, not their CMake packages)."""
        rocm = self.at("/opt/rocm")
        out = version_output if version_output is not None else (
            "HIP version: 6.1.40091-a8dbc0c19\nAMD clang version 17.0.0\nTarget: x86_64-unknown-linux-gnu")
        write_tool(rocm / "bin" / "hipcc", out)
        if hipblas:
            touch(rocm / "lib" / "libhipblas.so")
        if rocblas:
            touch(rocm / "lib" / "librocblas.so")
        self.hip_cmake(rocm / "lib", "6.1.40091")
        return rocm

    def hip_cmake(self, libdir: Path, version: str,
                  packages: tuple = ("hip", "hip-lang", "hipblas", "rocblas")) -> None:
        """The CMake packages ggml-hip finds, as ROCm installs them in <libdir>/cmake."""
        for p in packages:
            touch(libdir / "cmake" / p / f"{p}-config.cmake")
        if "hip" in packages:
            touch(libdir / "cmake" / "hip" / "hip-config-version.cmake", f'set(PACKAGE_VERSION "{version}")\n')

    def debian_rocm(self, version: str = "6.4.43484", clang: bool = True,
                    packages: tuple = ("hip", "hip-lang", "hipblas", "rocblas"), platform: str = "amd") -> Path:
        """Debian's layout (sid): hipcc and hipconfig in /usr/bin (not on the fake PATH),
        libraries and CMake packages in the multiarch directory, the clang hipcc runs in
        /usr/lib/llvm-21/bin."""
        usr = self.at("/usr")
        multiarch = usr / "lib" / "x86_64-linux-gnu"
        llvm_bin = usr / "lib" / "llvm-21" / "bin"
        write_tool(usr / "bin" / "hipcc", f"HIP version: {version}-9999\nDebian clang version 21.1.8 (14)")
        write_tool(usr / "bin" / "hipconfig", script=(
            f'case "$1" in\n  --version) printf "%s" "{version}-9999" ;;\n'
            f'  --platform) printf "%s" "{platform}" ;;\n'
            f'  --hipclangpath) printf "%s" "{llvm_bin}" ;;\n  *) exit 1 ;;\nesac\n'))
        if clang:
            write_tool(llvm_bin / "clang++", "Debian clang version 21.1.8 (14)")
        for lib in ("libamdhip64.so.6", "libhipblas.so.2", "librocblas.so.4"):
            touch(multiarch / lib)
        self.hip_cmake(multiarch, version, packages)
        return usr

    def oneapi(self, with_icx: bool = True) -> Path:
        oneapi = self.tmp / "oneapi"
        bindir = oneapi / "compiler" / "latest" / "bin"
        write_tool(bindir / "icpx", "Intel(R) oneAPI DPC++/C++ Compiler 2025.0.4 (2025.0.4.20241205)\n"
                   "Target: x86_64-unknown-linux-gnu")
        if with_icx:
            write_tool(bindir / "icx", "Intel(R) oneAPI DPC++/C++ Compiler 2025.0.4 (2025.0.4.20241205)")
        self.env["ONEAPI_ROOT"] = str(oneapi)
        return oneapi

    def vulkan_headers(self, include_dir: Path, patch: int, minor: int = 3) -> Path:
        touch(include_dir / "vulkan" / "vulkan_core.h",
              "#ifndef VULKAN_CORE_H_\n#define VULKAN_CORE_H_ 1\n"
              f"#define VK_HEADER_VERSION {patch}\n"
              f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, {minor}, VK_HEADER_VERSION)\n"
              "#endif\n")
        return include_dir

    def vulkan_rest(self, loader: str | None = "libvulkan.so.1", glslc: bool = True, spirv: bool = True) -> None:
        """Everything of a Vulkan SDK except the headers."""
        if loader:
            touch(self.at("/usr/lib/x86_64-linux-gnu") / loader)
            if loader == "libvulkan.so":
                touch(self.at("/usr/lib/x86_64-linux-gnu") / "libvulkan.so.1")
        if glslc:
            self.tool("glslc", "shaderc v2023.2 v2023.2\nspirv-tools v2023.1 v2022.4-296-ge5c4a4e2\n"
                      "glslang 11.1.0-763-g76b52ebf\nTarget: SPIR-V 1.0")
        if spirv:
            touch(self.at("/usr/share/cmake/SPIRV-Headers") / "SPIRV-HeadersConfig.cmake")

    def opencl(self) -> None:
        touch(self.at("/usr/include/CL/cl.h"), '#include <CL/cl_version.h>\n#ifdef CL_VERSION_1_2\n#endif\n')
        touch(self.at("/usr/include/CL/cl_version.h"), "#define CL_VERSION_2_0 1\n#define CL_VERSION_3_0 1\n")
        touch(self.at("/usr/lib/x86_64-linux-gnu/libOpenCL.so.1"))

    def xcrun(self, metal_works: bool = True, sdk_works: bool = True) -> Path:
        metal = ('printf "%s\\n" "Apple metal version 32023.620 (metalfe-32023.620.1)" '
                 '"Target: air64-apple-darwin24.0.0"; exit 0' if metal_works
                 else 'echo "xcrun: error: unable to find utility \\"metal\\", not a developer tool"; exit 72')
        sdk = ('echo /Library/Developer/CommandLineTools/SDKs/MacOSX.sdk; exit 0' if sdk_works
               else 'echo "xcrun: error: SDK cannot be located"; exit 1')
        return self.tool("xcrun", script=f'case "$*" in\n  *metal*) {metal} ;;\n  *show-sdk-path*) {sdk} ;;\n'
                                         '  *) exit 1 ;;\nesac\n')


@pytest.fixture
def fake(tmp_path) -> Fake:
    return Fake(tmp_path)


# --------------------------------------------------------------------------------------
# the backend table
# --------------------------------------------------------------------------------------

def test_backend_table_names_flags_and_registries():
    assert [b.name for b in bc.BACKENDS] == ["cpu", "cuda", "hip", "sycl", "metal", "vulkan", "opencl", "rpc", "blas"]
    assert [b.flag for b in bc.BACKENDS] == ["GGML_CPU", *FLAGS]
    assert [b.registry for b in bc.BACKENDS] == ["CPU", "CUDA", "ROCm", "SYCL", "MTL", "Vulkan", "OpenCL", "RPC", "BLAS"]
    assert [b.make_target for b in bc.BACKENDS] == [f"build-{b.name}" for b in bc.BACKENDS]
    assert {b.name for b in bc.BACKENDS if not b.offload} == {"cpu", "blas"}
    for b in bc.BACKENDS:
        assert b.title and b.install_hint and b.sdk_name
    with pytest.raises(Exception):
        bc.BACKENDS[0].name = "gpu"  # frozen


def test_backend_lookups():
    assert bc.backend_by_name("hip").flag == "GGML_HIP"
    assert bc.backend_by_name("nope") is None
    assert bc.backend_by_registry("ROCm").name == "hip"
    assert bc.backend_by_registry("MTL").name == "metal"
    assert bc.backend_by_registry("Vulkan").name == "vulkan"
    assert bc.backend_by_registry("Nope") is None


def test_vulkan_install_hint_mentions_packages_and_setup_script():
    hint = bc.backend_by_name("vulkan").install_hint
    for word in ("libvulkan-dev", "glslc", "mesa-vulkan-drivers", "spirv-headers", "scripts/setup.sh --vulkan-headers"):
        assert word in hint


# --------------------------------------------------------------------------------------
# parse_flag
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["1", "ON", "on", "On", "true", "TRUE", "True", "yes", "YES", " 1 "])
def test_parse_flag_true(value):
    assert bc.parse_flag("GGML_CUDA", value) is True


@pytest.mark.parametrize("value", ["0", "OFF", "off", "Off", "false", "FALSE", "no", "No", "NO"])
def test_parse_flag_false(value):
    assert bc.parse_flag("GGML_CUDA", value) is False


@pytest.mark.parametrize("value", [None, "", "  "])
def test_parse_flag_unset(value):
    assert bc.parse_flag("GGML_CUDA", value) is None


@pytest.mark.parametrize("value", ["2", "maybe", "y", "enable", "1.0"])
def test_parse_flag_invalid_names_variable_and_value(value):
    with pytest.raises(bc.BuildConfigError) as err:
        bc.parse_flag("GGML_VULKAN", value)
    msg = str(err.value)
    assert "GGML_VULKAN" in msg and value in msg
    assert "on/off" in msg and "yes/no" in msg
    assert isinstance(err.value, ValueError)


# --------------------------------------------------------------------------------------
# host_path (the fake-root test hook)
# --------------------------------------------------------------------------------------

def test_host_path_prefixes_system_paths_only_with_fake_root(tmp_path):
    assert bc.host_path("/opt/rocm", {}) == "/opt/rocm"
    env = {"POLYLLAMA_FAKE_ROOT": str(tmp_path)}
    assert bc.host_path("/opt/rocm/bin/hipcc", env) == str(tmp_path / "opt/rocm/bin/hipcc")
    assert bc.host_path("relative/x", env) == "relative/x"
    env["POLYLLAMA_FAKE_DEV_ROOT"] = str(tmp_path / "devroot")
    assert bc.host_path("/dev/kfd", env) == str(tmp_path / "devroot/dev/kfd")
    assert bc.host_path("/usr/include", env) == str(tmp_path / "usr/include")


# --------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------

def test_cuda_not_found(fake):
    info = bc.detect_cuda(fake.env)
    assert info.found is False and info.version is None
    assert any("nvcc" in m for m in info.missing)
    assert info.device_present is False
    assert info.device_note == "no NVIDIA GPU found (nvidia-smi missing or failed)"


def test_cuda_via_cuda_home(fake):
    toolkit = fake.cuda_toolkit(fake.tmp / "cuda-12.4")
    fake.env["CUDA_HOME"] = str(toolkit)
    info = bc.detect_cuda(fake.env)
    assert info.found and info.version == "12.4"
    assert info.path == str(toolkit)
    assert info.tool == str(toolkit / "bin" / "nvcc")
    # not on PATH, so CMake must be told which nvcc
    assert info.cmake == {"CMAKE_CUDA_COMPILER": str(toolkit / "bin" / "nvcc")}


def test_cuda_path_wins_over_cuda_home(fake):
    a = fake.cuda_toolkit(fake.tmp / "a", "12.4")
    b = fake.cuda_toolkit(fake.tmp / "b", "13.0")
    fake.env.update(CUDA_PATH=str(b), CUDA_HOME=str(a))
    assert bc.detect_cuda(fake.env).version == "13.0"


def test_cuda_via_path(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    info = bc.detect_cuda(fake.env)
    assert info.found and info.version == "12.4"
    assert info.path == str(fake.bin / "nvcc")  # no toolkit around a bare nvcc: report nvcc itself
    assert "CMAKE_CUDA_COMPILER" not in info.cmake


def test_cuda_in_usr_local_cuda(fake):
    fake.cuda_toolkit(fake.at("/usr/local/cuda"), "13.0")
    info = bc.detect_cuda(fake.env)
    assert info.found and info.version == "13.0"
    assert info.path == str(fake.at("/usr/local/cuda"))


def test_cuda_unparsable_version_still_found(fake):
    fake.tool("nvcc", "something else")
    info = bc.detect_cuda(fake.env)
    assert info.found and info.version is None
    assert any("version" in n for n in info.notes)


def test_cuda_gpu_from_nvidia_smi(fake):
    fake.nvidia_smi()
    info = bc.detect_cuda(fake.env)
    assert info.device_present is True
    assert info.archs == ["90"]
    assert info.devices == ["NVIDIA H100 80GB HBM3"]
    assert any("9.0" in n and "H100" in n for n in info.notes)


def test_cuda_several_gpus_distinct_archs(fake):
    fake.nvidia_smi("NVIDIA GeForce RTX 3090, 8.6", "NVIDIA H100 80GB HBM3, 9.0", "NVIDIA H100 80GB HBM3, 9.0")
    info = bc.detect_cuda(fake.env)
    assert info.archs == ["86", "90"] and len(info.devices) == 3


def test_cuda_nvidia_smi_failing_means_no_gpu(fake):
    fake.tool("nvidia-smi", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", rc=9)
    info = bc.detect_cuda(fake.env)
    assert info.device_present is False
    assert "nvidia-smi missing or failed" in info.device_note


def test_hanging_tool_times_out_fast(fake):
    fake.tool("nvidia-smi", script="while :; do :; done\n")
    t0 = time.monotonic()
    info = bc.detect_cuda(fake.env)
    assert time.monotonic() - t0 < bc.TOOL_TIMEOUT_S * 2 + 2
    assert info.device_present is False


# --------------------------------------------------------------------------------------
# HIP
# --------------------------------------------------------------------------------------

def test_hip_found_in_opt_rocm(fake):
    rocm = fake.rocm()
    info = bc.detect_hip(fake.env)
    assert info.found, info.missing
    assert info.version == "6.1.40091"
    assert info.path == str(rocm)
    assert any("hipBLAS" in n for n in info.notes) and any("rocBLAS" in n for n in info.notes)


def test_hip_not_found(fake):
    info = bc.detect_hip(fake.env)
    assert not info.found
    assert any("hipcc" in m for m in info.missing)
    assert info.device_present is False


def test_hip_missing_hipblas_is_not_found(fake):
    fake.rocm(hipblas=False)
    info = bc.detect_hip(fake.env)
    assert not info.found
    assert len(info.missing) == 1 and "hipBLAS" in info.missing[0]


def test_hip_missing_both_blas_libraries(fake):
    fake.rocm(hipblas=False, rocblas=False)
    info = bc.detect_hip(fake.env)
    assert not info.found
    assert any("hipBLAS" in m for m in info.missing) and any("rocBLAS" in m for m in info.missing)


def test_hip_blas_include_dirs_count(fake):
    rocm = fake.rocm(hipblas=False, rocblas=False)
    (rocm / "include" / "hipblas").mkdir(parents=True)
    (rocm / "include" / "rocblas").mkdir(parents=True)
    assert bc.detect_hip(fake.env).found


def test_hip_via_rocm_path_and_version_file(fake):
    rocm = fake.tmp / "rocm-6.2"
    write_tool(rocm / "bin" / "hipcc", "no version here", rc=1)
    touch(rocm / "lib" / "libhipblas.so.2")
    touch(rocm / "lib" / "librocblas.so.4")
    touch(rocm / ".info" / "version", "6.2.0-66\n")
    fake.hip_cmake(rocm / "lib", "6.2.41133")
    fake.env["ROCM_PATH"] = str(rocm)
    info = bc.detect_hip(fake.env)
    assert info.found and info.path == str(rocm)
    assert info.version == "6.2.0"


def test_hip_device_from_dev_kfd(fake):
    fake.rocm()
    touch(fake.at("/dev/kfd"))
    info = bc.detect_hip(fake.env)
    assert info.device_present is True


def test_hip_device_from_fake_dev_root(fake):
    devroot = fake.tmp / "devroot"
    touch(devroot / "dev" / "kfd")
    fake.env["POLYLLAMA_FAKE_DEV_ROOT"] = str(devroot)
    assert bc.detect_hip(fake.env).device_present is True


def test_hip_device_from_rocminfo(fake):
    fake.rocm()
    fake.tool("rocminfo", "Agent 1\n  Name:                    AMD EPYC 7763\n"
              "Agent 2\n  Name:                    gfx90a\n  Marketing Name:          AMD Instinct MI210\n")
    info = bc.detect_hip(fake.env)
    assert info.device_present is True
    assert info.archs == ["gfx90a"]
    assert info.devices == ["AMD Instinct MI210"]


def test_hip_rocminfo_without_gpu(fake):
    fake.tool("rocminfo", "ROCk module is NOT loaded, possibly no GPU devices", rc=1)
    assert bc.detect_hip(fake.env).device_present is False


def test_hip_debian_layout(fake):
    usr = fake.debian_rocm()
    info = bc.detect_hip(fake.env)
    assert info.found, info.missing
    assert info.tool == str(usr / "bin" / "hipcc") and info.path == str(usr)
    assert info.version == "6.4.43484"
    assert any(n.endswith("lib/x86_64-linux-gnu/libhipblas.so.2") for n in info.notes)
    assert any("from hipconfig --version" in n for n in info.notes)
    # hipconfig is not on PATH, so CMake could not ask it for the HIP clang: we name it
    assert info.cmake == {"CMAKE_HIP_COMPILER": str(usr / "lib" / "llvm-21" / "bin" / "clang++")}
    fake.env["HIPCXX"] = "/somewhere/clang++"  # the user's choice is left to CMake
    assert bc.detect_hip(fake.env).cmake == {}


def test_hip_debian_layout_with_hipconfig_on_path_leaves_the_compiler_to_cmake(fake):
    usr = fake.debian_rocm()
    fake.env["PATH"] += os.pathsep + str(usr / "bin")
    info = bc.detect_hip(fake.env)
    assert info.found and info.cmake == {}


def test_hip_debian_version_file_when_no_tool_runs(fake):
    usr = fake.debian_rocm()
    write_tool(usr / "bin" / "hipcc", "hipcc: version `GLIBC_2.38' not found", rc=1)
    write_tool(usr / "bin" / "hipconfig", "hipconfig: version `GLIBC_2.38' not found", rc=1)
    touch(usr / "share" / "hip" / "version", "# Auto-generated by cmake\nHIP_VERSION_MAJOR=6\n"
          "HIP_VERSION_MINOR=4\nHIP_VERSION_PATCH=43484\n")
    info = bc.detect_hip(fake.env)
    assert info.found, info.missing
    assert info.version == "6.4.43484"
    assert any(n.endswith("share/hip/version)") for n in info.notes)


@pytest.mark.parametrize("version", ["5.7.1", "6.0.32831"])
def test_hip_too_old_is_refused_before_compiling(fake, version):
    fake.debian_rocm(version=version)
    info = bc.detect_hip(fake.env)
    assert not info.found
    (msg,) = info.missing
    short = ".".join(version.split(".")[:3])
    assert f"HIP {short} is too old" in msg and ">= 6.1" in msg and "libamdhip64-dev" in msg
    r = run_cli(fake, "check", GGML_HIP="1")
    assert r.returncode == 2 and "too old" in r.stderr and "Install:" in r.stderr


def test_hip_6_1_is_new_enough(fake):
    fake.debian_rocm(version="6.1.40091")
    assert bc.detect_hip(fake.env).found


def test_hip_mixed_installations_are_refused(fake):
    # Debian's HIP 6.4 in /usr, and an old ROCm 5.7 in /opt/rocm that ggml-hip's CMake
    # would search first
    fake.debian_rocm()
    fake.hip_cmake(fake.at("/opt/rocm") / "lib", "5.7.31921")
    info = bc.detect_hip(fake.env)
    assert not info.found
    assert any("two ROCm installations are mixed" in m and "5.7.31921" in m and "ROCM_PATH" in m
               for m in info.missing), info.missing
    fake.env["ROCM_PATH"] = str(fake.at("/usr"))  # what the message says to do
    assert bc.detect_hip(fake.env).found


def test_hip_for_nvidia_is_refused(fake):
    fake.debian_rocm(platform="nvidia")
    info = bc.detect_hip(fake.env)
    assert not info.found
    assert any("'nvidia'" in m and "GGML_CUDA=1" in m for m in info.missing)


def test_hip_missing_cmake_packages_name_the_debian_package(fake):
    fake.debian_rocm(packages=("hip", "rocblas"))
    info = bc.detect_hip(fake.env)
    assert not info.found
    assert len(info.missing) == 2, info.missing
    assert "hip-lang" in info.missing[0] and "libamdhip64-dev" in info.missing[0]
    assert "hipblas-config.cmake" in info.missing[1] and "libhipblas-dev" in info.missing[1]


def test_hip_missing_clang_is_refused(fake):
    fake.debian_rocm(clang=False)
    info = bc.detect_hip(fake.env)
    assert not info.found
    assert any("clang++ not found" in m and "llvm-21" in m for m in info.missing)


def test_hip_min_version_is_the_pinned_ggml_hips():
    cmakelists = ROOT / "thirdparty" / "llama.cpp" / "ggml" / "src" / "ggml-hip" / "CMakeLists.txt"
    if not cmakelists.is_file():
        pytest.skip("the pinned llama.cpp is not fetched (scripts/fetch_llama_cpp.py)")
    m = re.search(r"hip_VERSION\}\s+VERSION_LESS\s+(\d+)\.(\d+)", cmakelists.read_text())
    assert m, "ggml-hip's HIP version check moved: update HIP_MIN_VERSION and this test"
    assert bc.HIP_MIN_VERSION == (int(m.group(1)), int(m.group(2)))


# The sid chroot that scripts/check_hip_build.sh makes, with Debian's real ROCm packages.
SID_CHROOT = Path(os.environ.get("POLYLLAMA_SID_CHROOT")
                  or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "polyllama" / "sid-rocm")


def sid_chroot() -> Path:
    if not (SID_CHROOT / ".polyllama-sid-rocm").is_file() or not (SID_CHROOT / "usr/bin/hipcc").is_file():
        pytest.skip(f"no sid ROCm chroot at {SID_CHROOT} (scripts/check_hip_build.sh --chroot-only makes one)")
    return SID_CHROOT


def test_hip_real_debian_layout_seen_from_the_host():
    # The chroot's hipcc needs sid's libc, so on the host it does not run: the version
    # comes from the files, and the layout (multiarch libraries, CMake packages) is real.
    root = sid_chroot()
    info = bc.detect_hip({"PATH": "", "POLYLLAMA_FAKE_ROOT": str(root), "POLYLLAMA_FAKE_DEV_ROOT": str(root)})
    assert info.found, info.missing
    assert info.tool == str(root / "usr/bin/hipcc") and info.path == str(root / "usr")
    assert bc._hip_version_tuple(info.version) >= bc.HIP_MIN_VERSION
    for lib in ("libhipblas.so", "librocblas.so"):
        assert any(f"/usr/lib/x86_64-linux-gnu/{lib}" in n for n in info.notes), info.notes
    assert any(n.startswith("CMake package hip ") and "/usr/lib/x86_64-linux-gnu/cmake/hip/" in n
               for n in info.notes), info.notes


def test_hip_real_debian_layout_inside_the_chroot():
    # buildconfig.py run by sid's python3 in the chroot, as `make build` runs it there:
    # hipconfig and hipcc run, and their answers are checked against the packages' files.
    root = sid_chroot()
    if os.geteuid() != 0:
        pytest.skip("entering the chroot needs root (chroot, mount)")
    # the two files it needs, laid out as in the checkout (it loads the table by path)
    copy = root / "tmp" / "polyllama_buildconfig"
    (copy / "buildtools").mkdir(parents=True, exist_ok=True)
    (copy / "src" / "polyllama").mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, copy / "buildtools" / "buildconfig.py")
    shutil.copy(TABLE, copy / "src" / "polyllama" / "backend_table.py")
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
         'mount -t proc proc "$1/proc"; exec chroot "$1" /usr/bin/env -i PATH=/usr/bin:/bin LANG=C.UTF-8 '
         'python3 /tmp/polyllama_buildconfig/buildtools/buildconfig.py json', "sh", str(root)],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    hip = json.loads(r.stdout)["detected"]["hip"]
    assert hip["found"], hip["missing"]
    assert hip["tool"] == "/usr/bin/hipcc" and hip["path"] == "/usr"
    header = (root / "usr/include/hip/hip_version.h").read_text()
    major, minor = (re.search(rf"#define HIP_VERSION_{k} (\d+)", header).group(1) for k in ("MAJOR", "MINOR"))
    assert hip["version"].startswith(f"{major}.{minor}.")
    assert "HIP " + hip["version"] + " (from hipconfig --version)" in hip["notes"]
    clang = next(n for n in hip["notes"] if n.startswith("HIP compiler for CMake: "))
    assert re.fullmatch(r"HIP compiler for CMake: /usr/lib/llvm-\d+/bin/clang\+\+", clang)
    assert hip["cmake"] == {}  # hipconfig is on PATH there: CMake finds the compiler itself
    if not os.path.exists("/dev/kfd"):
        assert hip["device_present"] is False


# --------------------------------------------------------------------------------------
# SYCL
# --------------------------------------------------------------------------------------

def test_sycl_found_via_oneapi_root(fake):
    oneapi = fake.oneapi()
    info = bc.detect_sycl(fake.env)
    assert info.found, info.missing
    assert info.version == "2025.0.4"
    bindir = oneapi / "compiler" / "latest" / "bin"
    assert info.cmake == {"CMAKE_C_COMPILER": str(bindir / "icx"), "CMAKE_CXX_COMPILER": str(bindir / "icpx")}
    assert any("setvars.sh" in n for n in info.notes)  # oneAPI environment not loaded


def test_sycl_found_in_opt_intel(fake):
    write_tool(fake.at("/opt/intel/oneapi/compiler/latest/bin/icpx"),
               "Intel(R) oneAPI DPC++/C++ Compiler 2024.2.1 (2024.2.1.20240711)")
    write_tool(fake.at("/opt/intel/oneapi/compiler/latest/bin/icx"), "")
    fake.env["SETVARS_COMPLETED"] = "1"
    info = bc.detect_sycl(fake.env)
    assert info.found and info.version == "2024.2.1"
    assert not any("setvars" in n for n in info.notes)


def test_sycl_not_found(fake):
    info = bc.detect_sycl(fake.env)
    assert not info.found and any("icpx" in m for m in info.missing)
    assert info.device_present is None  # no sycl-ls: cannot tell


def test_sycl_missing_icx(fake):
    fake.oneapi(with_icx=False)
    info = bc.detect_sycl(fake.env)
    assert not info.found and any("icx" in m for m in info.missing)


def test_sycl_devices_from_sycl_ls(fake):
    fake.oneapi()
    fake.tool("sycl-ls", "[opencl:cpu][opencl:0] Intel(R) OpenCL, Intel(R) Xeon(R) 2.1 [2024.18.6.0.02_160000]\n"
              "[level_zero:gpu][level_zero:0] Intel(R) Level-Zero, Intel(R) Arc(TM) A770 Graphics 1.3 [1.3.26241]")
    info = bc.detect_sycl(fake.env)
    assert info.device_present is True
    assert len(info.devices) == 1 and "A770" in info.devices[0]


def test_sycl_ls_cpu_only_means_no_device(fake):
    fake.tool("sycl-ls", "[opencl:cpu][opencl:0] Intel(R) OpenCL, Intel(R) Xeon(R) 2.1 [2024.18.6.0.02_160000]")
    assert bc.detect_sycl(fake.env).device_present is False


# --------------------------------------------------------------------------------------
# Vulkan
# --------------------------------------------------------------------------------------

def test_vulkan_nothing_installed_lists_every_missing_piece(fake):
    info = bc.detect_vulkan(fake.env)
    assert not info.found
    text = " | ".join(info.missing)
    for piece in ("headers", "loader", "glslc", "SPIRV-Headers"):
        assert piece in text
    assert info.device_present is None  # no vulkaninfo


def test_vulkan_too_old_system_headers(fake):
    fake.vulkan_headers(fake.at("/usr/include"), 239)
    fake.vulkan_rest()
    info = bc.detect_vulkan(fake.env)
    assert not info.found
    assert info.version == "1.3.239"
    assert len(info.missing) == 1
    assert "too old" in info.missing[0] and "scripts/setup.sh --vulkan-headers" in info.missing[0]
    assert ("Vulkan headers 1.3.239 are too old for ggml-vulkan (needs VK_EXT_layer_settings, "
            "headers >= 1.3.261); run scripts/setup.sh --vulkan-headers") in info.notes
    assert "Vulkan_INCLUDE_DIR" not in info.cmake


def test_vulkan_new_headers_in_cache_win(fake):
    fake.vulkan_headers(fake.at("/usr/include"), 239)
    cache_include = fake.vulkan_headers(fake.cache / "vulkan-headers" / "usr" / "include", 309, minor=4)
    fake.vulkan_rest()
    info = bc.detect_vulkan(fake.env)
    assert info.found, info.missing
    assert info.version == "1.4.309"
    assert info.cmake["Vulkan_INCLUDE_DIR"] == str(cache_include)
    assert info.path == str(fake.at("/usr/lib/x86_64-linux-gnu/libvulkan.so.1"))
    assert any("glslc 2023.2" in n for n in info.notes)


def test_vulkan_cache_dir_from_xdg_cache_home(fake):
    del fake.env["POLYLLAMA_CACHE_DIR"]
    xdg = fake.tmp / "xdg"
    fake.env["XDG_CACHE_HOME"] = str(xdg)
    include = fake.vulkan_headers(xdg / "polyllama" / "vulkan-headers" / "usr" / "include", 309, minor=4)
    fake.vulkan_rest()
    assert bc.detect_vulkan(fake.env).cmake["Vulkan_INCLUDE_DIR"] == str(include)


def test_vulkan_cache_dir_from_home(fake):
    del fake.env["POLYLLAMA_CACHE_DIR"]
    include = fake.vulkan_headers(fake.tmp / "home" / ".cache" / "polyllama" / "vulkan-headers" / "usr" / "include", 300)
    fake.vulkan_rest()
    assert bc.detect_vulkan(fake.env).cmake["Vulkan_INCLUDE_DIR"] == str(include)


def test_vulkan_explicit_include_dir_comes_first(fake):
    explicit = fake.vulkan_headers(fake.tmp / "mine", 280)
    fake.vulkan_headers(fake.cache / "vulkan-headers" / "usr" / "include", 309, minor=4)
    fake.env["POLYLLAMA_VULKAN_INCLUDE_DIR"] = str(explicit)
    fake.vulkan_rest()
    info = bc.detect_vulkan(fake.env)
    assert info.version == "1.3.280" and info.cmake["Vulkan_INCLUDE_DIR"] == str(explicit)


def test_vulkan_too_old_explicit_dir_falls_through(fake):
    explicit = fake.vulkan_headers(fake.tmp / "mine", 239)
    fake.vulkan_headers(fake.at("/usr/include"), 275)
    fake.env["POLYLLAMA_VULKAN_INCLUDE_DIR"] = str(explicit)
    fake.vulkan_rest()
    info = bc.detect_vulkan(fake.env)
    assert info.found and info.version == "1.3.275"
    assert "Vulkan_INCLUDE_DIR" not in info.cmake  # system headers need no hint


def test_vulkan_sdk_env(fake):
    sdk = fake.tmp / "VulkanSDK" / "x86_64"
    fake.vulkan_headers(sdk / "include", 296)
    touch(sdk / "lib" / "libvulkan.so")
    write_tool(sdk / "bin" / "glslc", "shaderc v2024.3 v2024.3")
    touch(sdk / "share" / "cmake" / "SPIRV-Headers" / "SPIRV-HeadersConfig.cmake")
    fake.env["VULKAN_SDK"] = str(sdk)
    info = bc.detect_vulkan(fake.env)
    assert info.found, info.missing
    assert info.cmake == {"Vulkan_INCLUDE_DIR": str(sdk / "include")}
    assert info.path == str(sdk / "lib" / "libvulkan.so")


@pytest.mark.parametrize("patch,minor,ok", [(260, 3, False), (261, 3, True), (0, 4, True), (999, 2, False)])
def test_vulkan_minimum_header_version(fake, patch, minor, ok):
    fake.vulkan_headers(fake.at("/usr/include"), patch, minor)
    fake.vulkan_rest(loader="libvulkan.so")
    info = bc.detect_vulkan(fake.env)
    assert info.found is ok
    assert info.version == f"1.{minor}.{patch}"


def test_vulkan_runtime_loader_only_is_named_for_cmake(fake):
    fake.vulkan_headers(fake.at("/usr/include"), 275)
    fake.vulkan_rest(loader="libvulkan.so.1")
    info = bc.detect_vulkan(fake.env)
    assert info.found
    assert info.cmake["Vulkan_LIBRARY"] == str(fake.at("/usr/lib/x86_64-linux-gnu/libvulkan.so.1"))


def test_vulkan_dev_loader_needs_no_hint(fake):
    fake.vulkan_headers(fake.at("/usr/include"), 275)
    fake.vulkan_rest(loader="libvulkan.so")
    assert bc.detect_vulkan(fake.env).cmake == {}


# `glslc --version` of Debian 12's glslc package, as printed on our build machine
GLSLC_DEBIAN12 = "shaderc 2023.2-1\nspirv-tools 2022.4+1.3.236.0-1\nglslang 11.13.0-1\n\nTarget: SPIR-V 1.0"


def test_vulkan_glslc_version_debian_format(fake):
    fake.vulkan_headers(fake.at("/usr/include"), 275)
    fake.vulkan_rest(glslc=False)
    glslc = fake.tool("glslc", GLSLC_DEBIAN12)
    info = bc.detect_vulkan(fake.env)
    assert info.found, info.missing
    assert f"glslc 2023.2 at {glslc}" in info.notes


def test_vulkan_glslc_version_unknown_output(fake):
    fake.vulkan_headers(fake.at("/usr/include"), 275)
    fake.vulkan_rest(glslc=False)
    glslc = fake.tool("glslc", "something else entirely")
    assert f"glslc (version unknown) at {glslc}" in bc.detect_vulkan(fake.env).notes


def test_vulkan_loader_version_from_real_file_name(fake):
    # Debian 12: libvulkan.so -> libvulkan.so.1 -> libvulkan.so.1.3.239, with newer headers
    lib = fake.at("/usr/lib/x86_64-linux-gnu")
    touch(lib / "libvulkan.so.1.3.239")
    (lib / "libvulkan.so.1").symlink_to("libvulkan.so.1.3.239")
    (lib / "libvulkan.so").symlink_to("libvulkan.so.1")
    fake.vulkan_headers(fake.cache / "vulkan-headers" / "usr" / "include", 309, minor=4)
    fake.vulkan_rest(loader=None)
    info = bc.detect_vulkan(fake.env)
    assert info.found, info.missing
    assert info.version == "1.4.309" and info.path == str(lib / "libvulkan.so")
    # the headers' version is not called the SDK's next to a different loader
    assert info.summary() == f"Vulkan SDK: headers 1.4.309, loader 1.3.239 at {lib / 'libvulkan.so'}"
    assert f"loader 1.3.239 at {lib / 'libvulkan.so'} (-> libvulkan.so.1.3.239)" in info.notes


def test_vulkan_loader_without_version_in_name(fake):
    fake.vulkan_headers(fake.at("/usr/include"), 275)
    fake.vulkan_rest(loader="libvulkan.so.1")
    info = bc.detect_vulkan(fake.env)
    lib = fake.at("/usr/lib/x86_64-linux-gnu/libvulkan.so.1")
    assert info.summary() == f"Vulkan SDK: headers 1.3.275, loader at {lib}"
    assert f"loader at {lib}" in info.notes


@pytest.mark.parametrize("drop", ["loader", "glslc", "spirv"])
def test_vulkan_each_missing_piece(fake, drop):
    fake.vulkan_headers(fake.at("/usr/include"), 275)
    fake.vulkan_rest(loader=None if drop == "loader" else "libvulkan.so.1",
                     glslc=drop != "glslc", spirv=drop != "spirv")
    info = bc.detect_vulkan(fake.env)
    assert not info.found and len(info.missing) == 1
    assert {"loader": "loader", "glslc": "glslc", "spirv": "SPIRV-Headers"}[drop] in info.missing[0]


VULKANINFO_LLVMPIPE = """\
==========
VULKANINFO
==========

Vulkan Instance Version: 1.3.239

Devices:
========
GPU0:
\tapiVersion         = 1.3.230
\tdriverVersion      = 0.0.1
\tvendorID           = 0x10005
\tdeviceID           = 0x0000
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
"""


def test_vulkan_cpu_type_device(fake):
    fake.tool("vulkaninfo", VULKANINFO_LLVMPIPE)
    info = bc.detect_vulkan(fake.env)
    assert info.device_present is False          # software rendering only: GGML_AUTO skips it
    assert "GGML_AUTO leaves Vulkan off" in info.device_note
    assert info.cpu_type_devices == 1
    assert info.devices == ["llvmpipe (LLVM 15.0.6, 256 bits) [CPU]"]
    assert any("GGML_VK_VISIBLE_DEVICES" in n and "llvmpipe" in n for n in info.notes)


def test_vulkan_discrete_gpu(fake):
    fake.tool("vulkaninfo", VULKANINFO_LLVMPIPE.replace("PHYSICAL_DEVICE_TYPE_CPU", "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU")
              .replace("llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H100 80GB HBM3"))
    info = bc.detect_vulkan(fake.env)
    assert info.device_present is True and info.cpu_type_devices == 0
    assert not any("GGML_VK_VISIBLE_DEVICES" in n for n in info.notes)


def test_vulkaninfo_without_devices(fake):
    fake.tool("vulkaninfo", "ERROR: [Loader Message] Code 0 : vkCreateInstance: Found no drivers!\n"
              "Cannot create Vulkan instance.\nERROR_INCOMPATIBLE_DRIVER", rc=1)
    assert bc.detect_vulkan(fake.env).device_present is False


# --------------------------------------------------------------------------------------
# OpenCL, Metal, BLAS, CPU, RPC
# --------------------------------------------------------------------------------------

def test_opencl_found(fake):
    fake.opencl()
    info = bc.detect_opencl(fake.env)
    assert info.found, info.missing
    assert info.version == "3.0"
    assert info.path == str(fake.at("/usr/lib/x86_64-linux-gnu/libOpenCL.so.1"))
    assert any("Adreno" in n and "Intel" in n for n in info.notes)
    assert info.device_present is None  # no clinfo


def test_opencl_not_found(fake):
    info = bc.detect_opencl(fake.env)
    assert not info.found
    assert any("CL/cl.h" in m for m in info.missing) and any("libOpenCL" in m for m in info.missing)


def test_opencl_ocl_root(fake):
    root = fake.tmp / "ocl"
    touch(root / "include" / "CL" / "cl.h")
    touch(root / "lib" / "libOpenCL.so")
    fake.env["OCL_ROOT"] = str(root)
    assert bc.detect_opencl(fake.env).found


def test_opencl_clinfo_intel_gpu(fake):
    fake.tool("clinfo", "Platform #0: Intel(R) OpenCL Graphics\n `-- Device #0: Intel(R) Arc(TM) A770 Graphics")
    info = bc.detect_opencl(fake.env)
    assert info.device_present is True and info.devices == ["Intel(R) Arc(TM) A770 Graphics"]


def test_opencl_clinfo_only_unsupported_devices(fake):
    fake.tool("clinfo", "Platform #0: NVIDIA CUDA\n `-- Device #0: NVIDIA H100 80GB HBM3")
    info = bc.detect_opencl(fake.env)
    assert info.device_present is False and "H100" in info.device_note


def test_opencl_clinfo_pocl_cpu_device_does_not_count(fake):
    # PoCL's CPU device carries the CPU's name, "Intel" included; ggml-opencl rejects it
    fake.tool("clinfo", "Platform #0: Portable Computing Language\n"
              " `-- Device #0: pthread-skylake-avx512-Intel(R) Xeon(R) Processor")
    info = bc.detect_opencl(fake.env)
    assert info.device_present is False
    assert info.devices == ["pthread-skylake-avx512-Intel(R) Xeon(R) Processor"]


def test_metal_not_on_linux(fake):
    fake.xcrun()
    info = bc.detect_metal(fake.env)
    assert not info.found and info.device_present is False
    assert any("macOS" in m for m in info.missing)


def test_metal_on_darwin_with_metal_compiler(fake):
    fake.env["POLYLLAMA_FAKE_PLATFORM"] = "darwin"
    fake.xcrun()
    info = bc.detect_metal(fake.env)
    assert info.found and info.version == "32023.620"
    assert info.device_present is True


def test_metal_on_darwin_with_command_line_tools_only(fake):
    fake.env["POLYLLAMA_FAKE_PLATFORM"] = "darwin"
    fake.xcrun(metal_works=False)
    info = bc.detect_metal(fake.env)
    assert info.found and info.version is None
    assert info.path.endswith("MacOSX.sdk")
    assert any("run time" in n for n in info.notes)


def test_metal_on_darwin_without_xcrun(fake):
    fake.env["POLYLLAMA_FAKE_PLATFORM"] = "darwin"
    info = bc.detect_metal(fake.env)
    assert not info.found and any("xcrun" in m for m in info.missing)


def test_metal_on_darwin_with_broken_xcrun(fake):
    fake.env["POLYLLAMA_FAKE_PLATFORM"] = "darwin"
    fake.xcrun(metal_works=False, sdk_works=False)
    assert not bc.detect_metal(fake.env).found


def test_blas(fake):
    assert not bc.detect_blas(fake.env).found
    touch(fake.at("/usr/lib/x86_64-linux-gnu/libopenblas.so.0"))
    info = bc.detect_blas(fake.env)
    assert info.found and info.path.endswith("libopenblas.so.0")


def test_blas_vendor_trusted(fake):
    fake.env["GGML_BLAS_VENDOR"] = "Intel10_64lp"
    assert bc.detect_blas(fake.env).found


def test_cpu_and_rpc_always_found(fake):
    assert bc.detect_cpu(fake.env).found and bc.detect_cpu(fake.env).device_present is True
    assert bc.detect_rpc(fake.env).found


def test_detect_all_covers_every_backend_fast(fake):
    t0 = time.monotonic()
    sdks = bc.detect_all(fake.env)
    assert time.monotonic() - t0 < 2
    assert list(sdks) == [b.name for b in bc.BACKENDS]
    assert all(isinstance(s, bc.SdkInfo) and s.backend == n for n, s in sdks.items())
    json.dumps({n: s.__dict__ for n, s in sdks.items()})  # plain data


def test_detector_odd_environment_does_not_raise(fake):
    fake.env["CUDA_HOME"] = "bad\0path"
    fake.env["VULKAN_SDK"] = "bad\0path"
    (fake.at("/usr/include/vulkan/vulkan_core.h")).mkdir(parents=True)  # a directory, not a file
    assert bc.detect_cuda(fake.env).found is False
    assert bc.detect_vulkan(fake.env).found is False


def test_detector_bug_becomes_unfound_sdk():
    @bc._never_raises
    def detect_broken(env=None):
        raise KeyError("oops")

    info = detect_broken({})
    assert info.backend == "broken" and info.found is False
    assert "KeyError" in info.missing[0]


# --------------------------------------------------------------------------------------
# resolve
# --------------------------------------------------------------------------------------

def test_resolve_no_flags_is_cpu_only(fake):
    cfg = bc.resolve(fake.env)
    assert cfg.enabled == {b.name: b.name == "cpu" for b in bc.BACKENDS}
    assert cfg.enabled_backends == ["cpu"]
    assert cfg.options == {**{flag: "OFF" for flag in FLAGS}, "POLYLLAMA_PORTABLE": "OFF"}
    assert cfg.cmake_args() == [f"-D{flag}=OFF" for flag in FLAGS] + ["-DPOLYLLAMA_PORTABLE=OFF"]
    assert all(v is None for v in cfg.requested.values())
    assert cfg.sdks == {}  # nothing requested, nothing detected


def test_resolve_cuda_requested_without_nvcc_fails_fast(fake):
    t0 = time.monotonic()
    with pytest.raises(bc.MissingSdkError) as err:
        bc.resolve({**fake.env, "GGML_CUDA": "1"})
    assert time.monotonic() - t0 < 5
    msg = str(err.value)
    assert "GGML_CUDA=1 was requested but the CUDA toolkit was not found" in msg
    assert "nvcc" in msg
    assert "Install: " + bc.backend_by_name("cuda").install_hint in msg
    assert isinstance(err.value, bc.BuildConfigError)


def test_resolve_reports_all_missing_sdks_at_once(fake):
    with pytest.raises(bc.MissingSdkError) as err:
        bc.resolve({**fake.env, "GGML_CUDA": "on", "GGML_HIP": "yes", "GGML_VULKAN": "TRUE", "GGML_RPC": "1"})
    msg = str(err.value)
    assert "GGML_CUDA=1" in msg and "GGML_HIP=1" in msg and "GGML_VULKAN=1" in msg
    assert "hipcc" in msg and "RPC" not in msg


def test_resolve_check_false_never_raises_for_sdks(fake):
    cfg = bc.resolve({**fake.env, "GGML_CUDA": "1", "GGML_VULKAN": "1"}, check=False)
    assert cfg.enabled["cuda"] and cfg.enabled["vulkan"]
    assert "-DGGML_CUDA=ON" in cfg.cmake_args() and "-DGGML_VULKAN=ON" in cfg.cmake_args()
    assert set(cfg.sdks) == {"cuda", "vulkan"}
    assert len(bc.missing_sdk_problems(cfg)) == 2


def test_resolve_bad_flag_raises_even_without_check(fake):
    with pytest.raises(bc.BuildConfigError, match="GGML_HIP"):
        bc.resolve({**fake.env, "GGML_HIP": "2"}, check=False)
    with pytest.raises(bc.BuildConfigError, match="GGML_AUTO"):
        bc.resolve({**fake.env, "GGML_AUTO": "maybe"}, check=False)


def test_resolve_cuda_with_sdk_passes_check(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    cfg = bc.resolve({**fake.env, "GGML_CUDA": "1", "CMAKE_CUDA_ARCHITECTURES": "86;90"})
    assert cfg.enabled_backends == ["cpu", "cuda"]
    assert cfg.options["GGML_CUDA"] == "ON"
    assert cfg.options["CMAKE_CUDA_ARCHITECTURES"] == "86;90"
    assert not any("CMAKE_CUDA_ARCHITECTURES" in w for w in cfg.warnings)


def test_resolve_cuda_without_archs_or_gpu_warns(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    cfg = bc.resolve({**fake.env, "GGML_CUDA": "1"})
    assert "CMAKE_CUDA_ARCHITECTURES" not in cfg.options
    assert any("CMAKE_CUDA_ARCHITECTURES" in w and "long time" in w for w in cfg.warnings)


def test_auto_skips_cuda_without_gpu(fake):
    fake.cuda_toolkit(fake.at("/usr/local/cuda"), "12.4")
    cfg = bc.resolve({**fake.env, "GGML_AUTO": "1"})
    assert cfg.enabled["cuda"] is False
    assert cfg.options["GGML_CUDA"] == "OFF"
    warning = [w for w in cfg.warnings if "GGML_AUTO" in w]
    assert len(warning) == 1
    assert "CUDA toolkit 12.4 found at" in warning[0] and "no NVIDIA GPU" in warning[0]
    assert "set GGML_CUDA=1 to build it anyway" in warning[0]


def test_auto_enables_cuda_with_gpu_and_takes_its_arch(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    fake.nvidia_smi()
    cfg = bc.resolve({**fake.env, "GGML_AUTO": "1"})
    assert cfg.enabled_backends == ["cpu", "cuda"]
    assert cfg.options["GGML_CUDA"] == "ON"
    assert cfg.options["CMAKE_CUDA_ARCHITECTURES"] == "90"
    assert set(cfg.sdks) == set(AUTO_ORDER)


def test_explicit_off_beats_auto(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    fake.nvidia_smi()
    cfg = bc.resolve({**fake.env, "GGML_AUTO": "1", "GGML_CUDA": "0"})
    assert cfg.enabled["cuda"] is False and cfg.options["GGML_CUDA"] == "OFF"
    assert "CMAKE_CUDA_ARCHITECTURES" not in cfg.options
    assert "cuda" not in cfg.sdks  # explicitly off: not even detected


def test_explicit_on_beats_missing_gpu(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    cfg = bc.resolve({**fake.env, "GGML_AUTO": "1", "GGML_CUDA": "1"})
    assert cfg.enabled["cuda"] is True
    assert not any("GGML_AUTO skips" in w for w in cfg.warnings)


def test_auto_enables_vulkan_with_unknown_device_and_never_rpc_or_blas(fake):
    fake.vulkan_headers(fake.cache / "vulkan-headers" / "usr" / "include", 309, minor=4)
    fake.vulkan_rest()
    touch(fake.at("/usr/lib/x86_64-linux-gnu/libopenblas.so"))
    cfg = bc.resolve({**fake.env, "GGML_AUTO": "yes"})
    assert cfg.enabled_backends == ["cpu", "vulkan"]
    assert cfg.options["Vulkan_INCLUDE_DIR"] == str(fake.cache / "vulkan-headers" / "usr" / "include")
    assert cfg.options["GGML_RPC"] == "OFF" and cfg.options["GGML_BLAS"] == "OFF"


def test_auto_with_nothing_installed_is_cpu_only(fake):
    cfg = bc.resolve({**fake.env, "GGML_AUTO": "1"})
    assert cfg.enabled_backends == ["cpu"]


def test_darwin_default_enables_metal(fake):
    fake.env["POLYLLAMA_FAKE_PLATFORM"] = "darwin"
    fake.xcrun()
    cfg = bc.resolve(fake.env)
    assert cfg.enabled_backends == ["cpu", "metal"]
    assert cfg.options["GGML_METAL"] == "ON"
    assert cfg.requested["metal"] is None


def test_darwin_metal_can_be_turned_off(fake):
    fake.env["POLYLLAMA_FAKE_PLATFORM"] = "darwin"
    cfg = bc.resolve({**fake.env, "GGML_METAL": "off"})
    assert cfg.enabled_backends == ["cpu"] and cfg.options["GGML_METAL"] == "OFF"


def test_darwin_default_metal_missing_sdk_says_how_to_skip(fake):
    fake.env["POLYLLAMA_FAKE_PLATFORM"] = "darwin"
    with pytest.raises(bc.MissingSdkError) as err:
        bc.resolve(fake.env)
    assert "by default" in str(err.value) and "GGML_METAL=0" in str(err.value)


def test_metal_requested_on_linux_is_missing(fake):
    with pytest.raises(bc.MissingSdkError, match="macOS"):
        bc.resolve({**fake.env, "GGML_METAL": "1"})


def test_cmake_args_pass_through_last(fake):
    cfg = bc.resolve({**fake.env, "GGML_RPC": "1", "CMAKE_ARGS": "-DFOO=bar -DLLAMA_CURL=OFF '-DX=a b'"})
    args = cfg.cmake_args()
    assert args[-3:] == ["-DFOO=bar", "-DLLAMA_CURL=OFF", "-DX=a b"]
    assert "-DGGML_RPC=ON" in args[:-3]
    assert "FOO" not in cfg.options


def test_cmake_args_backend_flag_counts_as_requested(fake):
    cfg = bc.resolve({**fake.env, "CMAKE_ARGS": "-DGGML_RPC:BOOL=ON -D GGML_NATIVE=OFF"})
    assert cfg.enabled["rpc"] and cfg.requested["rpc"] is True
    assert cfg.options["GGML_RPC"] == "ON" and cfg.options["GGML_NATIVE"] == "OFF"


def test_cmake_args_contradicting_environment_is_an_error(fake):
    with pytest.raises(bc.BuildConfigError, match="CMAKE_ARGS"):
        bc.resolve({**fake.env, "GGML_RPC": "0", "CMAKE_ARGS": "-DGGML_RPC=ON"})
    # the same value in both places is fine
    assert bc.resolve({**fake.env, "GGML_RPC": "1", "CMAKE_ARGS": "-DGGML_RPC=ON"}).enabled["rpc"]


def test_cmake_args_unbalanced_quote(fake):
    with pytest.raises(bc.BuildConfigError, match="CMAKE_ARGS"):
        bc.resolve({**fake.env, "CMAKE_ARGS": "-DFOO='bar"})


def test_gpu_targets_and_amdgpu_targets(fake):
    fake.rocm()
    env = {**fake.env, "GGML_HIP": "1"}
    with pytest.raises(bc.BuildConfigError, match="AMDGPU_TARGETS"):
        bc.resolve({**env, "GPU_TARGETS": "gfx90a", "AMDGPU_TARGETS": "gfx1100"})
    assert bc.resolve({**env, "GPU_TARGETS": "gfx90a", "AMDGPU_TARGETS": "gfx90a"}).options["GPU_TARGETS"] == "gfx90a"
    assert bc.resolve({**env, "AMDGPU_TARGETS": "gfx1100"}).options["GPU_TARGETS"] == "gfx1100"
    cfg = bc.resolve(env)
    assert "GPU_TARGETS" not in cfg.options and any("GPU_TARGETS" in w for w in cfg.warnings)
    # only passed when HIP is built
    assert "GPU_TARGETS" not in bc.resolve({**fake.env, "GPU_TARGETS": "gfx90a"}).options


def test_native_blas_vendor_and_opencl_options(fake):
    fake.opencl()
    touch(fake.at("/usr/lib/x86_64-linux-gnu/libopenblas.so"))
    cfg = bc.resolve({**fake.env, "GGML_NATIVE": "false", "GGML_BLAS": "1", "GGML_BLAS_VENDOR": "OpenBLAS",
                      "GGML_OPENCL": "1"})
    opts = cfg.options
    assert opts["GGML_NATIVE"] == "OFF" and opts["GGML_BLAS_VENDOR"] == "OpenBLAS"
    assert opts["GGML_OPENCL_USE_ADRENO_KERNELS"] == "OFF" and opts["GGML_OPENCL_EMBED_KERNELS"] == "ON"
    assert list(opts)[:8] == list(FLAGS)  # backend flags first, in table order


def test_sycl_compilers_become_options(fake):
    oneapi = fake.oneapi()
    cfg = bc.resolve({**fake.env, "GGML_SYCL": "1"})
    assert cfg.options["CMAKE_CXX_COMPILER"] == str(oneapi / "compiler" / "latest" / "bin" / "icpx")
    assert any("setvars.sh" in w for w in cfg.warnings)
    # SDK extras only for backends that are built
    fake.env.pop("ONEAPI_ROOT")
    assert "CMAKE_CXX_COMPILER" not in bc.resolve(fake.env).options


def test_resolve_reuses_given_detection(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    detected = {"cuda": bc.SdkInfo("cuda", True, version="99.9", archs=["100"], device_present=True)}
    cfg = bc.resolve({**fake.env, "GGML_CUDA": "1"}, detected=detected)
    assert cfg.sdks["cuda"].version == "99.9" and cfg.options["CMAKE_CUDA_ARCHITECTURES"] == "100"


def test_to_json_round_trips(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    data = json.loads(json.dumps(bc.resolve({**fake.env, "GGML_CUDA": "1"}).to_json()))
    assert data["enabled_backends"] == ["cpu", "cuda"]
    assert data["sdks"]["cuda"]["version"] == "12.4"
    assert data["cmake_args"][0] == "-DGGML_CUDA=ON"


def test_cmake_file_text(fake):
    fake.vulkan_headers(fake.cache / "vulkan-headers" / "usr" / "include", 309, minor=4)
    fake.vulkan_rest(loader="libvulkan.so")
    cfg = bc.resolve({**fake.env, "GGML_VULKAN": "1", "GGML_BLAS_VENDOR": 'we"ird$x'})
    text = bc.cmake_file_text(cfg)
    assert 'set(GGML_VULKAN "ON" CACHE BOOL "" FORCE)' in text
    assert 'set(GGML_BLAS_VENDOR "we\\"ird\\$x" CACHE STRING "" FORCE)' in text
    assert 'set(POLYLLAMA_ENABLED_BACKENDS "cpu;vulkan")' in text


# --------------------------------------------------------------------------------------
# the command line, run as a script the way the Makefile and CMakeLists.txt run it
# --------------------------------------------------------------------------------------

def run_cli(fake: Fake, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env={**fake.env, **env}, cwd=ROOT, timeout=60)


def test_cli_check_missing_rocm_exits_2(fake):
    r = run_cli(fake, "check", GGML_HIP="1")
    assert r.returncode == 2
    assert r.stderr.startswith("polyllama build config: error: ")
    assert "hipcc" in r.stderr and "ROCm" in r.stderr
    assert r.stdout == ""


def test_cli_check_ok_prints_summary(fake):
    r = run_cli(fake, "check", GGML_RPC="1")
    assert r.returncode == 0, r.stderr
    assert "polyllama: building backends: cpu, rpc" in r.stderr


def test_cli_bad_flag_exits_2(fake):
    r = run_cli(fake, "cmake-args", GGML_CUDA="maybe")
    assert r.returncode == 2
    assert "polyllama build config: error: " in r.stderr and "GGML_CUDA" in r.stderr and "maybe" in r.stderr


def test_cli_cmake_args_ignores_missing_sdk(fake):
    r = run_cli(fake, "cmake-args", GGML_VULKAN="1", CMAKE_ARGS="-DFOO='a b'")
    assert r.returncode == 0, r.stderr
    args = shlex.split(r.stdout)
    assert "-DGGML_VULKAN=ON" in args and "-DGGML_CUDA=OFF" in args
    assert args[-1] == "-DFOO=a b"
    assert len(r.stdout.strip().splitlines()) == 1


def test_cli_cmake_args_warnings_go_to_stderr(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    r = run_cli(fake, "cmake-args", GGML_CUDA="1")
    assert r.returncode == 0
    assert "warning" in r.stderr and "CMAKE_CUDA_ARCHITECTURES" in r.stderr
    assert "warning" not in r.stdout


def test_cli_cmake_file(fake, tmp_path):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    out = tmp_path / "sub" / "flags.cmake"
    r = run_cli(fake, "cmake-file", str(out), GGML_CUDA="1", CMAKE_CUDA_ARCHITECTURES="90",
                CMAKE_ARGS="-DFOO=bar")
    assert r.returncode == 0, r.stderr
    lines = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert lines == [
        'set(GGML_CUDA "ON" CACHE BOOL "" FORCE)',
        'set(GGML_HIP "OFF" CACHE BOOL "" FORCE)',
        'set(GGML_SYCL "OFF" CACHE BOOL "" FORCE)',
        'set(GGML_METAL "OFF" CACHE BOOL "" FORCE)',
        'set(GGML_VULKAN "OFF" CACHE BOOL "" FORCE)',
        'set(GGML_OPENCL "OFF" CACHE BOOL "" FORCE)',
        'set(GGML_RPC "OFF" CACHE BOOL "" FORCE)',
        'set(GGML_BLAS "OFF" CACHE BOOL "" FORCE)',
        'set(POLYLLAMA_PORTABLE "OFF" CACHE BOOL "" FORCE)',
        'set(POLYLLAMA_CUDA_RUNTIME "shared" CACHE STRING "" FORCE)',
        'set(CMAKE_CUDA_ARCHITECTURES "90" CACHE STRING "" FORCE)',
        'set(POLYLLAMA_ENABLED_BACKENDS "cpu;cuda")',
        'set(POLYLLAMA_CPU_ISA_OPTIONS "SSE42;AVX;AVX2;BMI2;FMA;F16C;AVX_VNNI;AVX512;AVX512_VBMI;AVX512_VNNI;AVX512_BF16;AMX_TILE;AMX_INT8;AMX_BF16")',
        'set(POLYLLAMA_BACKEND_FLAGS "GGML_CUDA;GGML_HIP;GGML_SYCL;GGML_METAL;GGML_VULKAN;GGML_OPENCL;GGML_RPC;GGML_BLAS")',
    ]
    assert "FOO" not in out.read_text().replace("CMAKE_ARGS", "")  # pass-through left to make and scikit-build-core
    assert "CMAKE_ARGS" in out.read_text()  # ...and the comment says so


def test_cli_cmake_file_fails_on_missing_sdk(fake, tmp_path):
    out = tmp_path / "flags.cmake"
    r = run_cli(fake, "cmake-file", str(out), GGML_SYCL="1")
    assert r.returncode == 2 and "icpx" in r.stderr
    assert not out.exists()


def test_cli_show(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    t0 = time.monotonic()
    r = run_cli(fake, "show", GGML_VULKAN="1")
    assert time.monotonic() - t0 < 5
    assert r.returncode == 0, r.stderr
    for b in bc.BACKENDS:
        assert b.flag in r.stdout
    assert "12.4" in r.stdout
    assert bc.backend_by_name("vulkan").install_hint in r.stdout
    assert "would stop" in r.stdout and "-DGGML_VULKAN=ON" in r.stdout


def test_cli_json(fake):
    r = run_cli(fake, "json", GGML_RPC="1")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["enabled_backends"] == ["cpu", "rpc"]
    assert set(data["detected"]) == {b.name for b in bc.BACKENDS}


def test_cli_runs_from_any_directory(fake, tmp_path):
    # CMake runs it from the build directory; it finds the backend table from its own path
    env = {**fake.env, "GGML_RPC": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "cmake-args"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "-DGGML_RPC=ON" in r.stdout


def test_cli_unknown_command(fake):
    r = run_cli(fake, "frobnicate")
    assert r.returncode == 2


# --------------------------------------------------------------------------------------
# portable builds (make wheel) and the wheel's dependencies
# --------------------------------------------------------------------------------------

def test_portable_build_targets_the_table_not_this_machine(fake):
    from polyllama.backend_table import CPU_ISA_FLAGS, PORTABLE_CPU_ISA, by_name
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    fake.nvidia_smi()   # an H100 here: a local build would compile for 90 alone
    env = {**fake.env, "GGML_CUDA": "1", "POLYLLAMA_PORTABLE": "1", "POLYLLAMA_FAKE_MACHINE": "x86_64"}
    cfg = bc.resolve(env)
    assert cfg.options["GGML_NATIVE"] == "OFF" and cfg.options["POLYLLAMA_PORTABLE"] == "ON"
    assert cfg.options["CMAKE_CUDA_ARCHITECTURES"] == by_name("cuda").portable_archs
    assert cfg.options["GGML_CUDA_NCCL"] == "OFF"
    assert bc.resolve({**env, "GGML_CUDA_NCCL": "1"}).options["GGML_CUDA_NCCL"] == "ON"
    assert {k: v for k, v in cfg.options.items() if k[5:] in CPU_ISA_FLAGS} == {
        f"GGML_{isa}": "ON" if isa in PORTABLE_CPU_ISA else "OFF" for isa in CPU_ISA_FLAGS}
    # what the user sets still wins
    cfg = bc.resolve({**env, "GGML_AVX512": "1", "CMAKE_CUDA_ARCHITECTURES": "89", "GGML_NATIVE": "1"})
    assert cfg.options["GGML_AVX512"] == "ON" and cfg.options["CMAKE_CUDA_ARCHITECTURES"] == "89"
    assert cfg.options["GGML_NATIVE"] == "ON"
    # a local build names no instruction set (-march=native) and takes this machine's GPU
    cfg = bc.resolve({**env, "POLYLLAMA_PORTABLE": "0"})
    assert "GGML_NATIVE" not in cfg.options and "GGML_CUDA_NCCL" not in cfg.options and not any(k[5:] in CPU_ISA_FLAGS for k in cfg.options)
    assert cfg.options["CMAKE_CUDA_ARCHITECTURES"] == "90"


def test_cuda_runtime_setting(fake):
    fake.tool("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    env = {**fake.env, "GGML_CUDA": "1", "CMAKE_CUDA_ARCHITECTURES": "90"}
    assert bc.resolve(env).options["POLYLLAMA_CUDA_RUNTIME"] == "shared"
    assert bc.resolve({**env, "POLYLLAMA_CUDA_RUNTIME": "STATIC"}).options["POLYLLAMA_CUDA_RUNTIME"] == "static"
    with pytest.raises(bc.BuildConfigError, match=r"POLYLLAMA_CUDA_RUNTIME='dynamic': use shared"):
        bc.resolve({**env, "POLYLLAMA_CUDA_RUNTIME": "dynamic"})
    assert "POLYLLAMA_CUDA_RUNTIME" not in bc.resolve(fake.env).options


@pytest.mark.parametrize("release, expected", [
    ("12.4", ["nvidia-cuda-runtime-cu12>=12.0", "nvidia-cublas-cu12>=12.0"]),
    ("13.0", ["nvidia-cuda-runtime>=13.0,<14", "nvidia-cublas>=13.0,<14"]),
])
def test_wheel_depends_on_nvidia_runtime_wheels_of_its_toolkit(fake, release, expected):
    from buildtools import wheel_metadata
    fake.tool("nvcc", f"Cuda compilation tools, release {release}, V{release}.1")
    env = {**fake.env, "GGML_CUDA": "1", "CMAKE_CUDA_ARCHITECTURES": "90"}
    assert wheel_metadata.runtime_dependencies(env) == expected
    assert wheel_metadata.runtime_dependencies({**env, "POLYLLAMA_CUDA_RUNTIME": "static"}) == []
    assert wheel_metadata.runtime_dependencies(fake.env) == []


def test_wheel_for_an_unknown_cuda_major_is_refused(fake):
    from buildtools import wheel_metadata
    fake.tool("nvcc", "Cuda compilation tools, release 11.8, V11.8.89")
    with pytest.raises(ValueError, match=r"no NVIDIA runtime wheels are known for CUDA '11.8' \(known: 12, 13\); "
                                         "build with POLYLLAMA_CUDA_RUNTIME=static"):
        wheel_metadata.runtime_dependencies({**fake.env, "GGML_CUDA": "1", "CMAKE_CUDA_ARCHITECTURES": "86"})


def test_variant_names_and_what_a_wheel_leaves_out():
    from buildtools import wheel as w
    assert w.variant_of({"backends": ["cpu"]}) == "cpu"
    assert w.variant_of({"backends": ["cpu", "vulkan", "opencl", "rpc"]}) == "vulkan-opencl-rpc"
    info = {"backends": ["cpu", "cuda", "vulkan"], "cuda_version": "13.0.88", "cuda_runtime": "shared"}
    assert w.variant_of(info) == "cu13-vulkan"
    assert w.excluded_libs(info) == ["libcuda.so.1", "libvulkan.so.1",
                                     "libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]
    assert w.excluded_libs({**info, "cuda_runtime": "static"}) == ["libcuda.so.1", "libvulkan.so.1"]
