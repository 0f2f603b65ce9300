# What the libtorch that find_package(Torch) found can do, detected from its own headers rather
# than from its version number: the CMake counterpart of include/mpiddp/compat.hpp.
#
#   CMAKE_CXX_STANDARD      17 where libtorch's headers accept C++17, 20 where they demand it
#                           (ATen.h of libtorch 2.14+ stops with "#error C++20 or later ...").
#                           A value the user gives (-DCMAKE_CXX_STANDARD=20) is kept, and checked.
#   mpiddp_gloo_dtypes(INCLUDE_DIR)   sets MPIDDP_GLOO_HALF and MPIDDP_GLOO_BFLOAT16 (1 yes, 0 no,
#                                     -1 gloo does not say: compat.hpp decides).

# Preprocesses one line including libtorch's umbrella header at C++<std>: the #error that newer
# headers raise for an older standard fires here in about a second, with no compile or link.
function(_mpiddp_torch_accepts_std std out)
  set(probe ${PROJECT_BINARY_DIR}/CMakeFiles/mpiddp_std_probe.cpp)
  file(WRITE ${probe} "#include <torch/torch.h>\n")
  set(includes)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    list(APPEND includes -I${dir})
  endforeach()
  separate_arguments(torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -std=c++${std} ${torch_flags} ${includes} -E ${probe} -o /dev/null
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0)
    set(${out} TRUE PARENT_SCOPE)
  else()
    string(REGEX MATCH "#error[^\n]*" first_error "${err}")
    set(${out} FALSE PARENT_SCOPE)
    set(${out}_WHY "${first_error}" PARENT_SCOPE)
  endif()
endfunction()

if(NOT DEFINED CMAKE_CXX_STANDARD)
  foreach(std 17 20 23)
    _mpiddp_torch_accepts_std(${std} _ok)
    if(_ok)
      set(CMAKE_CXX_STANDARD ${std})
      break()
    endif()
  endforeach()
  if(NOT CMAKE_CXX_STANDARD)
    message(FATAL_ERROR "mpiddp: libtorch's headers (${TORCH_INCLUDE_DIRS}) do not preprocess with "
                        "${CMAKE_CXX_COMPILER} at C++17, 20 or 23: ${_ok_WHY}")
  endif()
else()
  _mpiddp_torch_accepts_std(${CMAKE_CXX_STANDARD} _ok)
  if(NOT _ok)
    message(FATAL_ERROR "mpiddp: CMAKE_CXX_STANDARD=${CMAKE_CXX_STANDARD} but libtorch's headers refuse it: "
                        "${_ok_WHY} (leave CMAKE_CXX_STANDARD unset to let mpiddp choose)")
  endif()
endif()
message(STATUS "mpiddp: C++${CMAKE_CXX_STANDARD} (the lowest standard libtorch ${Torch_VERSION} accepts)")

# c10d's Gloo reduces float16 and bfloat16 only when the gloo it was built with says so: gloo's
# config.h defines GLOO_USE_TORCH_DTYPES (0 or 1) since gloo learned torch's dtypes; Debian's is 0
# and c10d then refuses both ("Invalid scalar type"). Older gloo (no such macro) carries float16
# as gloo::float16 and c10d added bfloat16 on its own from libtorch 2.1: that last case is the one
# gate that only a version can tell (MPIDDP_GLOO_HAS_BFLOAT16 in compat.hpp).
function(mpiddp_gloo_dtypes include_dir)
  file(STRINGS ${include_dir}/gloo/config.h line REGEX "^#define GLOO_USE_TORCH_DTYPES[ \t]+[0-9]")
  if(line)
    string(REGEX REPLACE ".*GLOO_USE_TORCH_DTYPES[ \t]+([0-9]).*" "\\1" value "${line}")
    set(MPIDDP_GLOO_HALF ${value} PARENT_SCOPE)
    set(MPIDDP_GLOO_BFLOAT16 ${value} PARENT_SCOPE)
    set(how "GLOO_USE_TORCH_DTYPES=${value}")
  else()
    set(MPIDDP_GLOO_HALF 1 PARENT_SCOPE)
    set(MPIDDP_GLOO_BFLOAT16 -1 PARENT_SCOPE)  # -1: decided by compat.hpp
    set(how "gloo without GLOO_USE_TORCH_DTYPES: float16 as gloo::float16")
  endif()
  message(STATUS "mpiddp: Gloo dtypes: ${how}")
endfunction()
