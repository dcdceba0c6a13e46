# polyllama_quiet_upstream(DIR): compile every C/C++ target defined under the build
# directory DIR (an add_subdirectory of upstream code) with -w, so that upstream warnings do
# not bury the build's output. Only those targets: polyllama's own keep their warnings.
function(polyllama_quiet_upstream dir)
    get_property(_targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(_t IN LISTS _targets)
        get_target_property(_type ${_t} TYPE)
        if (_type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
            if (NOT MSVC)
                target_compile_options(${_t} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-w>)
            endif()
        endif()
    endforeach()
    get_property(_subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    foreach(_d IN LISTS _subdirs)
        polyllama_quiet_upstream("${_d}")
    endforeach()
endfunction()
