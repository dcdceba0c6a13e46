# Included by CMakeLists.txt after llama.cpp's targets exist (it changes ggml-cpu's flags).
# Sets POLYLLAMA_CPU_AMX_STATE, which build_info.json records.
#
# Intel AMX in ggml-cpu. -march=native (GGML_NATIVE, ggml's default) compiles ggml's AMX
# kernels in on a CPU that advertises AMX; weights then go to an "AMX" buffer, single tokens
# use its AVX512-VNNI kernels and prompts its tile kernels. Two things can break the tiles:
#  * the compiler: ggml-cpu/amx/mmq.cpp fills its tile configuration on the stack and passes
#    it to _tile_loadconfig; GCC 12 at -O3 drops those stores (seen in its disassembly: only
#    the first 32 bytes zeroed and the palette set), ldtilecfg then faults on the garbage
#    (SIGSEGV in ggml_backend_amx_mul_mat at the first prompt of more than a few tokens, in
#    llama-bench, llama-cpp-python and polyllama alike; llama.cpp PR #26954 describes it).
#    At -O2 GCC keeps them, so that one file is compiled at -O2 whenever AMX is kept;
#  * the machine: a CPU or kernel that advertises AMX but does not run its tile
#    instructions from every thread.
# AUTO (default) runs a tile multiply in a worker thread on the build machine, the machine
# a native build is for: if it faults, or gives a wrong sum, -mno-amx-* goes after ggml's
# own -march=native (every other native extension stays). ON keeps AMX without the probe,
# OFF removes it. docs/ARCHITECTURE.md §5.
set(POLYLLAMA_CPU_AMX AUTO CACHE STRING "Intel AMX in ggml-cpu: AUTO (probe its tile instructions here), ON or OFF")
set_property(CACHE POLYLLAMA_CPU_AMX PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${POLYLLAMA_CPU_AMX}" _amx)
set(POLYLLAMA_CPU_AMX_STATE "not applicable (not x86-64 with GCC/Clang)")
if (TARGET ggml-cpu AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64"
    AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    if (_amx MATCHES "^(OFF|0|FALSE|NO)$")
        set(_amx_keep FALSE)
        set(POLYLLAMA_CPU_AMX_STATE "off (POLYLLAMA_CPU_AMX=OFF)")
    elseif (_amx MATCHES "^(ON|1|TRUE|YES)$")
        set(_amx_keep TRUE)
        set(POLYLLAMA_CPU_AMX_STATE "kept, not probed (POLYLLAMA_CPU_AMX=ON)")
    elseif (_amx STREQUAL "AUTO" AND NOT GGML_NATIVE)
        # not built for this machine: AMX only where ggml's own GGML_AMX_* options ask
        set(_amx_keep TRUE)
        set(POLYLLAMA_CPU_AMX_STATE "as ggml's GGML_AMX_* options say (GGML_NATIVE=OFF)")
    elseif (_amx STREQUAL "AUTO")
        include(CheckCSourceRuns)
        set(CMAKE_REQUIRED_FLAGS "-march=native -pthread")
        set(CMAKE_REQUIRED_LIBRARIES pthread)
        set(CMAKE_REQUIRED_QUIET ON)
        # exit 0: -march=native has no AMX here, or a worker thread's tile multiply summed right
        check_c_source_runs([=[
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
struct tile_config { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static int8_t a[16 * 64], b[16 * 64];
static int32_t c[16 * 16];
static void * multiply(void * arg) {
    static struct tile_config cfg;   /* static: the stores cannot be dropped */
    cfg.palette = 1;
    for (int t = 0; t < 3; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbssd(0, 1, 2);
    _tile_stored(0, c, 64);
    _tile_release();
    return arg;
}
int main(void) {
    pthread_t worker;
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 1;
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    /* ggml's tiles run on its worker threads, which were not the ones asking permission */
    if (pthread_create(&worker, NULL, multiply, NULL) || pthread_join(worker, NULL)) return 3;
    return c[0] == 64 * 1 * 2 ? 0 : 2;
}
#else
int main(void) { return 0; }
#endif
]=] POLYLLAMA_AMX_TILES_RUN)
        unset(CMAKE_REQUIRED_FLAGS)
        unset(CMAKE_REQUIRED_LIBRARIES)
        unset(CMAKE_REQUIRED_QUIET)
        if (POLYLLAMA_AMX_TILES_RUN)
            set(_amx_keep TRUE)
            set(POLYLLAMA_CPU_AMX_STATE "as -march=native finds it (AUTO: tile probe passed or no AMX)")
        else()
            set(_amx_keep FALSE)
            set(POLYLLAMA_CPU_AMX_STATE "off (AUTO: AMX tile instructions fault on this machine)")
            message(STATUS "polyllama: this CPU advertises AMX but its tile instructions fail here: "
                           "ggml-cpu is built without AMX (POLYLLAMA_CPU_AMX=ON forces it)")
        endif()
    else()
        message(FATAL_ERROR "POLYLLAMA_CPU_AMX must be AUTO, ON or OFF, not '${POLYLLAMA_CPU_AMX}'")
    endif()
    if (_amx_keep)
        # after the target's -O3: keeps the tile configuration's stores (see above)
        set_source_files_properties("${LLAMA_CPP_SOURCE_DIR}/ggml/src/ggml-cpu/amx/mmq.cpp"
            TARGET_DIRECTORY ggml-cpu PROPERTIES COMPILE_OPTIONS "-O2")
    else()
        target_compile_options(ggml-cpu PRIVATE -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
    endif()
endif()
