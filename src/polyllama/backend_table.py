"""The ggml backends polyllama knows, each fact about them stated once.

Everything that differs between backends and is not measured on the machine lives in
BACKENDS below: the flag that builds it, ggml's registry name, where it ranks for
backend="auto", whether it needs an SDK, a device, split buffers... The run time
(discovery, placement), the build (buildtools/buildconfig.py, which CMake and the Makefile
run) and the tests read this table; none of them lists backends again.

Standard library only, and no import of the rest of polyllama: the build loads this file
by path, before the extension exists (buildtools/buildconfig.py).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

__all__ = ["Backend", "BACKENDS", "BACKEND_NAMES", "AUTO_ORDER", "by_name", "by_registry",
           "host_path", "parse_vulkaninfo_summary", "CPU_ISA_FLAGS", "PORTABLE_CPU_ISA", "CUDA_RUNTIME_WHEELS",
           "cuda_runtime_wheels"]


@dataclass(frozen=True)
class Backend:
    name: str             # polyllama's name: LLM(backend=...), make build-<name>
    flag: str             # environment variable and CMake option that selects it
    registry: str         # ggml backend registry name (ggml_backend_reg_name)
    title: str            # human name
    sdk_name: str         # what must be installed to build it, for messages ("the CUDA toolkit")
    install_hint: str     # how to install that, Debian/Ubuntu first
    offload: bool         # model layers can be offloaded to its devices
    # Position in backend="auto" (1 first) and a GGML_AUTO candidate; None: never automatic.
    # Vendor-native backends first (the fastest kernels for their hardware), then the
    # portable Vulkan, then SYCL and OpenCL, whose ggml backends cover fewer ops. RPC needs
    # servers nobody can see at build time, BLAS only helps prompts on some CPUs.
    auto_rank: Optional[int] = None
    needs_sdk: bool = True        # False: a C++ compiler is all it takes
    needs_device: bool = True     # False: usable once compiled in (host, or servers added later)
    row_split: bool = False       # exports split buffers (split_mode="row"); in the pinned
                                  # llama.cpp only ggml-sycl does (CUDA/HIP moved to "tensor")
    in_build_all: bool = True     # part of `make build-all` (BLAS wants a vendor chosen)
    only_on: Optional[str] = None  # the one sys.platform it exists on
    # What the backend's registration log lines start with besides "ggml_<registry>:"
    # (ggml-hip is ggml-cuda compiled with HIP, and logs under ggml_cuda_init's name).
    log_prefix: str = ""
    no_registry_hint: str = ""    # compiled in, registry absent: what to look at
    no_device_hint: str = ""      # compiled in, no device: what it accepts
    # A portable build (POLYLLAMA_PORTABLE=1, what `make wheel` makes): the GPU code it
    # compiles, where a local build compiles for the GPUs it finds (docs/INSTALL.md)
    portable_archs: str = ""
    # Shared libraries of the user's system (drivers, ICD loaders) that the extension links
    # and a wheel must not carry, each with what provides it: auditwheel leaves them out, and
    # the package names the provider when one is missing (docs/INSTALL.md)
    system_libs: Tuple[Tuple[str, str], ...] = ()
    # LLM(device_sampling=True) is allowed: greedy picks in the decode graph (thirdparty patch
    # 0004) were seen to run there, host-sampled requests after them in the same slots
    # included (ARCHITECTURE.md §4.7). On lavapipe an earlier, per-sequence form (llama.cpp's
    # backend samplers) corrupted the heap inside ggml-vulkan; the batch-wide pick has not
    # run on Vulkan.
    device_sampling: bool = False
    # ... and LLM(device_sampling=None) turns it on where every layer is on this backend: it
    # measured faster than the host's pick there (H100, docs/benchmarks.md). Not on the CPU,
    # whose arg-max kernel runs on one thread while the host's scan is shared
    device_sampling_default: bool = False

    @property
    def make_target(self) -> str:
        return f"build-{self.name}"


BACKENDS: Tuple[Backend, ...] = (
    Backend("cpu", "GGML_CPU", "CPU", "CPU", "C/C++ toolchain",
            "Nothing extra: a C/C++ compiler and CMake (apt-get install build-essential cmake ninja-build).",
            offload=False, needs_sdk=False, needs_device=False, in_build_all=False, device_sampling=True),
    Backend("cuda", "GGML_CUDA", "CUDA", "CUDA (NVIDIA)", "CUDA toolkit",
            "On Debian/Ubuntu add NVIDIA's CUDA apt repository and "
            "`apt-get install cuda-toolkit` (or the distribution's nvidia-cuda-toolkit), elsewhere "
            "https://developer.nvidia.com/cuda-downloads; set CUDA_HOME if nvcc is neither on PATH "
            "nor in /usr/local/cuda.",
            offload=True, auto_rank=1, log_prefix="ggml_cuda_init:",
            # real code for Turing to Hopper (RTX 20xx .. H100/H200), PTX of 90 for newer GPUs
            portable_archs="75-real;80-real;86-real;89-real;90-real;90-virtual", device_sampling=True,
            device_sampling_default=True,
            system_libs=(("libcuda.so.1", "the NVIDIA driver (`nvidia-smi` works where it is installed)"),)),
    Backend("hip", "GGML_HIP", "ROCm", "HIP (AMD ROCm)", "ROCm HIP SDK",
            "ROCm >= 6.1 with hipBLAS and rocBLAS: on Debian sid `apt-get install hipcc libamdhip64-dev "
            "libhipblas-dev librocblas-dev` (HIP 6.4 in /usr; Debian 13's 5.7 is too old); elsewhere add AMD's "
            "ROCm apt repository and `apt-get install rocm-hip-sdk hipblas-dev rocblas-dev` (or "
            "`amdgpu-install --usecase=rocm`); set ROCM_PATH if it is in neither /opt/rocm nor /usr.",
            offload=True, auto_rank=2, log_prefix="ggml_cuda_init:"),
    Backend("sycl", "GGML_SYCL", "SYCL", "SYCL (Intel oneAPI)", "Intel oneAPI DPC++ compiler (icpx)",
            "The Intel oneAPI Base Toolkit: on Debian/Ubuntu add Intel's oneAPI apt repository and "
            "`apt-get install intel-oneapi-compiler-dpcpp-cpp intel-oneapi-mkl-devel` "
            "(or intel-oneapi-base-toolkit), then `source /opt/intel/oneapi/setvars.sh` before building.",
            offload=True, auto_rank=5, row_split=True),
    Backend("metal", "GGML_METAL", "MTL", "Metal (Apple)", "Xcode Metal toolchain",
            "macOS only: the Xcode command line tools (`xcode-select --install`); "
            "full Xcode adds the offline metal shader compiler.",
            offload=True, auto_rank=3, in_build_all=False, only_on="darwin"),
    Backend("vulkan", "GGML_VULKAN", "Vulkan", "Vulkan", "Vulkan SDK",
            "`apt-get install libvulkan-dev glslc mesa-vulkan-drivers spirv-headers` (vulkan-tools for "
            "vulkaninfo); Debian 12's Vulkan headers (1.3.239) are too old for ggml-vulkan, "
            "`scripts/setup.sh --vulkan-headers` fetches Debian 13's into the cache. Elsewhere install "
            "the LunarG Vulkan SDK and set VULKAN_SDK.",
            offload=True, auto_rank=4, system_libs=(("libvulkan.so.1", "the Vulkan loader (apt-get install libvulkan1) and a "
                                                     "Vulkan driver (mesa-vulkan-drivers, or the GPU vendor's)"),),
            no_registry_hint="the Vulkan loader found no usable driver; VK_LOADER_DEBUG=error shows why"),
    Backend("opencl", "GGML_OPENCL", "OpenCL", "OpenCL", "OpenCL SDK",
            "`apt-get install ocl-icd-opencl-dev opencl-headers clinfo` plus the GPU vendor's OpenCL "
            "driver (e.g. intel-opencl-icd); set OCL_ROOT for an SDK outside /usr.",
            offload=True, auto_rank=6, system_libs=(("libOpenCL.so.1", "an OpenCL ICD loader (apt-get install ocl-icd-libopencl1) "
                                                     "and the GPU vendor's OpenCL driver"),),
            no_device_hint="ggml-opencl accepts only Adreno/Qualcomm and Intel GPUs "
                           "with OpenCL C >= 2.0 and cl_khr_fp16"),
    Backend("rpc", "GGML_RPC", "RPC", "RPC (remote ggml servers)", "RPC backend",
            "Nothing extra: the RPC backend is plain C++ and talks to rpc-server over TCP.",
            offload=True, needs_sdk=False, needs_device=False),
    Backend("blas", "GGML_BLAS", "BLAS", "BLAS", "BLAS library",
            "`apt-get install libopenblas-dev` (ggml's default), or set GGML_BLAS_VENDOR for another "
            "BLAS (e.g. Intel10_64lp for MKL); on macOS Accelerate is always there.",
            offload=False, needs_device=False, in_build_all=False),
)

BACKEND_NAMES: Tuple[str, ...] = tuple(b.name for b in BACKENDS)
# backend="auto"'s order, and GGML_AUTO's candidates
AUTO_ORDER: Tuple[str, ...] = tuple(b.name for b in sorted((b for b in BACKENDS if b.auto_rank),
                                                           key=lambda b: b.auto_rank))

# ggml-cpu's x86 instruction-set options (GGML_<ISA>) and the /proc/cpuinfo flag each
# needs. A portable build (GGML_NATIVE=OFF) records those it compiled with in
# build_info.json, and the package checks them before it loads the extension: a CPU
# without them would die of SIGILL instead of reading an error.
CPU_ISA_FLAGS: Mapping[str, str] = {
    "SSE42": "sse4_2", "AVX": "avx", "AVX2": "avx2", "BMI2": "bmi2", "FMA": "fma", "F16C": "f16c",
    "AVX_VNNI": "avx_vnni", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_TILE": "amx_tile", "AMX_INT8": "amx_int8", "AMX_BF16": "amx_bf16",
}

# What a portable build (`make wheel`) asks of an x86-64 CPU: x86-64-v3 (Haswell, Zen 1 and
# later). The other options of CPU_ISA_FLAGS stay off there; a local build uses -march=native.
PORTABLE_CPU_ISA: Tuple[str, ...] = ("SSE42", "AVX", "AVX2", "BMI2", "FMA", "F16C")

# The CUDA runtime of a wheel built with POLYLLAMA_CUDA_RUNTIME=shared (the default) comes
# from NVIDIA's PyPI wheels, as PyTorch's does: by toolkit major version, the requirement
# the wheel declares and the libraries the package loads from it, in load order.
CUDA_RUNTIME_WHEELS: Mapping[int, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    12: (("nvidia-cuda-runtime-cu12>=12.0", "nvidia-cublas-cu12>=12.0"),
         ("libcudart.so.12", "libcublasLt.so.12", "libcublas.so.12")),
    13: (("nvidia-cuda-runtime>=13.0,<14", "nvidia-cublas>=13.0,<14"),
         ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")),
}


def cuda_runtime_wheels(version: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(requirements, sonames) for the CUDA toolkit `version` ("13.0.48"); ValueError for a
    major version this table does not know."""
    try:
        major = int(version.split(".")[0])
        return CUDA_RUNTIME_WHEELS[major]
    except (ValueError, KeyError):
        raise ValueError(f"no NVIDIA runtime wheels are known for CUDA {version!r} (known: "
                         f"{', '.join(str(k) for k in CUDA_RUNTIME_WHEELS)}); build with "
                         "POLYLLAMA_CUDA_RUNTIME=static") from None


_BY_NAME = {b.name: b for b in BACKENDS}
_BY_REGISTRY = {b.registry.lower(): b for b in BACKENDS}


def by_name(name: str) -> Optional[Backend]:
    """The Backend called `name` ("cuda"), or None."""
    return _BY_NAME.get(name)


def by_registry(regname: str) -> Optional[Backend]:
    """The Backend whose ggml registry is `regname` ("CUDA", "ROCm", "MTL"), or None."""
    return _BY_REGISTRY.get(regname.lower())


def host_path(path: str, env: Optional[Mapping[str, str]] = None) -> str:
    """A fixed absolute system path (/dev/kfd, /usr/include, ...), moved under a fake root
    when a test asks for one (POLYLLAMA_FAKE_ROOT, POLYLLAMA_FAKE_DEV_ROOT for /dev)."""
    env = os.environ if env is None else env
    if not os.path.isabs(path):
        return path
    root = env.get("POLYLLAMA_FAKE_ROOT")
    if path == "/dev" or path.startswith("/dev/"):
        root = env.get("POLYLLAMA_FAKE_DEV_ROOT") or root
    if not root:
        return path
    return os.path.join(root, path.lstrip("/"))


def parse_vulkaninfo_summary(text: str) -> list[tuple[str, str]]:
    """(device name, type) for each device `vulkaninfo --summary` lists; type is "CPU",
    "DISCRETE_GPU", ... A CPU-type device (Mesa's lavapipe) is one ggml-vulkan hides unless
    GGML_VK_VISIBLE_DEVICES is set. The build's SDK detection and discovery's explanation of
    a Vulkan build without devices read the same output."""
    types = re.findall(r"^\s*deviceType\s*=\s*(\S+)", text, re.MULTILINE)
    names = re.findall(r"^\s*deviceName\s*=\s*(.+?)\s*$", text, re.MULTILINE)
    return [(names[i] if i < len(names) else f"device {i}", t.replace("PHYSICAL_DEVICE_TYPE_", ""))
            for i, t in enumerate(types)]
