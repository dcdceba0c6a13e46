"""The HIP (AMD ROCm) backend as built: what it says with no AMD GPU.

Two kinds of test:

* the reason backends() gives for a HIP build without a device, composed from ggml's
  registration log and /dev/kfd. It runs on any build, the ROCm registry and ggml's log
  line being put in place with monkeypatch;
* checks of a real HIP build: scripts/check_hip_build.sh runs this file in its Debian sid
  chroot after `GGML_HIP=1 make build`, with POLYLLAMA_REQUIRE_HIP=1 so that a build
  without HIP fails here instead of skipping. Elsewhere they skip unless the extension
  has HIP compiled in.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from polyllama import LLM, NoDeviceError, backends
from polyllama import _llamacpp as llamacpp
from polyllama.info import build_info

ROOT = Path(__file__).resolve().parent.parent
NO_DEVICE_LINE = "ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected"


def hip_status():
    return next(s for s in backends() if s.name == "hip")


@pytest.fixture
def fake_rocm_without_device(monkeypatch, tmp_path):
    """A ROCm registry with no device, ggml's own log line about it, and /dev in tmp_path."""
    real = llamacpp.registries()
    monkeypatch.setattr(llamacpp, "registries", lambda: [*real, "ROCm"] if "ROCm" not in real else real)
    monkeypatch.setattr(llamacpp, "REGISTRATION_LOG", NO_DEVICE_LINE + "\nggml_vulkan: unrelated line")
    monkeypatch.setenv("POLYLLAMA_FAKE_DEV_ROOT", str(tmp_path))
    return tmp_path


def test_no_device_reason_names_the_missing_kernel_device(fake_rocm_without_device):
    st = hip_status()
    assert st.compiled and not st.devices and not st.usable
    assert st.reason == ("compiled in, no device found; /dev/kfd is absent: there is no AMD GPU here, "
                         "or the amdgpu kernel driver is not loaded; ggml said: failed to initialize ROCm: "
                         "no ROCm-capable device is detected")


def test_no_device_reason_with_dev_kfd_present(fake_rocm_without_device):
    (fake_rocm_without_device / "dev").mkdir()
    (fake_rocm_without_device / "dev" / "kfd").touch()
    st = hip_status()
    # the driver is there (and, as root or in the render group, open to us): ggml's word only
    if os.access(fake_rocm_without_device / "dev" / "kfd", os.R_OK | os.W_OK):
        assert st.reason == ("compiled in, no device found; ggml said: failed to initialize ROCm: "
                             "no ROCm-capable device is detected")
    else:
        assert "add it to the render group" in st.reason


# --- a real HIP build ---------------------------------------------------------------------

@pytest.fixture
def hip_build():
    info = build_info()
    if "hip" not in info.get("backends", []):
        if os.environ.get("POLYLLAMA_REQUIRE_HIP"):
            pytest.fail(f"POLYLLAMA_REQUIRE_HIP is set but the extension has no HIP: {info.get('backends')}")
        pytest.skip("the extension is built without HIP (GGML_HIP=1 make build; scripts/check_hip_build.sh)")
    return info


def test_hip_is_linked_in(hip_build):
    assert "ROCm" in llamacpp.registries()
    assert hip_build["flags"]["GGML_HIP"] == "ON"
    assert hip_build["flags"].get("GPU_TARGETS"), "make build passes GPU_TARGETS through to ggml-hip"
    assert hip_status().compiled


def test_hip_without_a_device(hip_build, model_path):
    st = hip_status()
    if st.devices:
        pytest.skip(f"an AMD device is visible: {[d.name for d in st.devices]}")
    assert not st.usable and st.reason.startswith("compiled in, no device found")
    if not os.path.exists("/dev/kfd"):
        assert "/dev/kfd is absent" in st.reason
    assert "ggml said: failed to initialize ROCm" in st.reason  # from the real ROCm runtime
    with pytest.raises(NoDeviceError) as e:
        LLM(model_path, backend="hip")
    assert str(e.value) == f"backend 'hip': {st.reason}"


# --- the script that makes such a build -----------------------------------------------------

@pytest.mark.parametrize("args, said", [(["--jobs", "x"], "--jobs wants a number"),
                                        (["--targets", "gfx1100 gfx90a"], "--targets wants gfx names"),
                                        (["--frobnicate"], "unknown option --frobnicate")])
def test_check_hip_build_refuses_bad_arguments(args, said):
    # before anything is made, mounted or asked of root
    r = subprocess.run(["bash", str(ROOT / "scripts" / "check_hip_build.sh"), *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and said in r.stderr, r.stderr
