# How the extension gets CUDA's runtime and cuBLAS (POLYLLAMA_CUDA_RUNTIME, set by
# buildtools/buildconfig.py from the environment).
#
#   shared (default)  ggml-cuda links libcudart.so.N and libcublas.so.N, as ggml does. A local
#                     build finds them in the toolkit; an installed wheel gets them from
#                     NVIDIA's PyPI wheels, which it declares as dependencies and which
#                     polyllama/_llamacpp_loader.py loads before the extension.
#   static            cudart and cuBLAS are linked into the extension: the wheel needs only
#                     the driver (libcuda.so.1), and carries cuBLAS's kernels itself.
#
# ggml's own switch for the static libraries, GGML_STATIC, also links every program with
# -static, which a Python extension cannot be; so the static case swaps the libraries of
# the ggml-cuda target here instead. docs/INSTALL.md gives the sizes of both and the choice.
function(polyllama_cuda_runtime mode)
    find_package(CUDAToolkit REQUIRED)
    set(CUDAToolkit_VERSION "${CUDAToolkit_VERSION}" PARENT_SCOPE)
    if (mode STREQUAL "static")
        foreach(_prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
            get_target_property(_libs ggml-cuda ${_prop})
            if (_libs)
                # (CUDA::cublas_static brings cublasLt_static and culibos with it)
                string(REGEX REPLACE "CUDA::(cudart|cublas)([;>]|$)" "CUDA::\\1_static\\2" _libs "${_libs}")
                set_target_properties(ggml-cuda PROPERTIES ${_prop} "${_libs}")
            endif()
        endforeach()
        message(STATUS "polyllama: CUDA runtime and cuBLAS linked statically")
    elseif (NOT mode STREQUAL "shared")
        message(FATAL_ERROR "POLYLLAMA_CUDA_RUNTIME=${mode}: shared or static")
    endif()
endfunction()
