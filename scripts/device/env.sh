# Sourced by scripts/device/build.sh, gpu.sh and wheel.sh on a GPU machine without
# network: unpack what scripts/device/bundle.sh carried and export what the build and the
# runs need. Safe to source more than once.
#
# Vulkan (when .devcarry/vulkan exists): the loader and glvnd's libraries (libGLdispatch,
# libEGL, libGLX, ...: NVIDIA's Vulkan ICD is libGLX_nvidia, which needs them) go into /,
# the device README's way for these runtime libraries; glslc, libshaderc and the SPIR-V headers go under /opt/polyllama-vk
# and reach the build through PATH, LD_LIBRARY_PATH and CMAKE_PREFIX_PATH; the newer
# Vulkan headers reach buildconfig.py through POLYLLAMA_VULKAN_INCLUDE_DIR. NVIDIA's driver
# ICD lives in the driver's read-only mount, so the loader is told where it is.
_devroot=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# the pinned llama.cpp tree, and the test vocabulary the random-weight models copy
if [ ! -f "$_devroot/thirdparty/llama.cpp/include/llama.h" ] && [ -f "$_devroot/.devcarry/llama.cpp.tar.gz" ]; then
  mkdir -p "$_devroot/thirdparty"
  tar xzf "$_devroot/.devcarry/llama.cpp.tar.gz" -C "$_devroot/thirdparty"
  mkdir -p "$_devroot/thirdparty/llama.cpp/models"
  cp "$_devroot/.devcarry/ggml-vocab-llama-bpe.gguf" "$_devroot/thirdparty/llama.cpp/models/"
fi
if [ -d "$_devroot/.devcarry/vulkan" ]; then
  _vk=/opt/polyllama-vk
  if [ ! -x "$_vk/usr/bin/glslc" ]; then
    mkdir -p "$_vk"
    for deb in "$_devroot"/.devcarry/vulkan/debs/*.deb; do
      case "$(basename "$deb")" in
        libvulkan1_*|libglvnd0_*|libegl1_*|libgl1_*|libglx0_*|libopengl0_*|libgles2_*) dpkg -x "$deb" / ;;
        *) dpkg -x "$deb" "$_vk" ;;
      esac
    done
    tar xzf "$_devroot/.devcarry/vulkan/headers.tar.gz" -C "$_vk"
    ldconfig
  fi
  export PATH="$_vk/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$_vk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$_vk/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export POLYLLAMA_VULKAN_INCLUDE_DIR="$_vk/usr/include"
  _icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -f "$_icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
    export VK_DRIVER_FILES="$_icd"
  fi
  _egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  if [ -f "$_egl" ] && [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ]; then
    export __EGL_VENDOR_LIBRARY_FILENAMES="$_egl"
  fi
fi
# the server extra (bundle.sh --server), installed beside the image's packages
if [ -d "$_devroot/.devcarry/server-wheels" ]; then
  if [ ! -d /tmp/polyllama-server-site/starlette ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/polyllama-server-site \
      "$_devroot"/.devcarry/server-wheels/*.whl >/dev/null
  fi
  case ":${PYTHONPATH:-}:" in
    *:/tmp/polyllama-server-site:*) ;;
    *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/polyllama-server-site" ;;
  esac
fi
unset _devroot _vk _icd _egl
