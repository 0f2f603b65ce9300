# What the libtorch that find_package(Torch) found can do, detected from its own headers rather
# than from its version number: the CMake counterpart of include/mpiddp/compat.hpp.
#
#   CMAKE_CXX_STANDARD      17 where libtorch's headers accept C++17, 20 where they demand it
#                           (ATen.h of libtorch 2.14+ stops with "#error C++20 or later ...").
#                           A value the user gives (-DCMAKE_CXX_STANDARD=20) is kept, and checked.
#   mpiddp_gloo_dtypes(INCLUDE_DIR)   sets MPIDDP_GLOO_HALF and MPIDDP_GLOO_BFLOAT16 (1 yes, 0 no,
#                                     -1 gloo does not say: compat.hpp decides).
#   mpiddp_use_one_torch()            TORCH_LIBRARIES from libtorch's own lib/ (MPIDDP_TORCH_LIB_DIR)
#                                     only; says which libtorch
#   mpiddp_nccl_version(HEADER OUT)   NCCL's version from nccl.h

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

# One libtorch per build, said once. TorchConfig adds c10 to TORCH_LIBRARIES by find_library(... PATHS
# <its lib/>), where the system's directories come first: beside a system libtorch (Debian's
# libtorch-dev) a wheel's build would link the system's libc10 as well as its own, two c10 in one
# process (heap corruption at exit). Every library in TORCH_LIBRARIES that libtorch's own lib/ has is
# taken from there; the torch target itself comes from Caffe2Targets and must lie there too, or two
# installations got mixed (another Caffe2Config was found first) and configuring stops.
# PyTorch's wheels also export their own copies of parts of libstdc++ from libtorch.so (std::filesystem,
# linked statically from their toolchain; pytorch/pytorch#133437), and the first library in a program's
# load order answers every call: libtorch.so's std::filesystem::remove_all jumps to address 0. So
# TORCH_LIBRARIES names the system's libstdc++ first, for every program that links libtorch.
# Then says which libtorch it is and whether it has CUDA kernels (libtorch_cuda: PyTorch's CUDA wheels
# and CUDA builds of libtorch; Debian's is CPU only).
macro(mpiddp_use_one_torch)
  get_filename_component(MPIDDP_TORCH_LIB_DIR "${TORCH_INSTALL_PREFIX}/lib" REALPATH)
  set(_torch_libraries)
  foreach(_item IN LISTS TORCH_LIBRARIES)
    if(IS_ABSOLUTE "${_item}")
      get_filename_component(_name "${_item}" NAME)
      if(EXISTS "${MPIDDP_TORCH_LIB_DIR}/${_name}")
        set(_item "${MPIDDP_TORCH_LIB_DIR}/${_name}")
      endif()
    endif()
    list(APPEND _torch_libraries "${_item}")
  endforeach()
  set(TORCH_LIBRARIES "-Wl,--push-state,--no-as-needed,-lstdc++,--pop-state" ${_torch_libraries})
  get_target_property(_configs torch IMPORTED_CONFIGURATIONS)
  list(GET _configs 0 _config)
  get_target_property(_library torch IMPORTED_LOCATION_${_config})
  get_filename_component(_library_real "${_library}" REALPATH)
  get_filename_component(_prefix_real "${TORCH_INSTALL_PREFIX}" REALPATH)
  string(FIND "${_library_real}" "${_prefix_real}/" _at)
  if(NOT _at EQUAL 0)
    message(FATAL_ERROR "mpiddp: two libtorch installations are mixed: TorchConfig from ${TORCH_INSTALL_PREFIX} "
                        "but libtorch from ${_library} (another Caffe2Config was found first). For a pip wheel pass "
                        "-DCMAKE_PREFIX_PATH=$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')")
  endif()
  if(TARGET torch_cuda)
    set(_cuda "with CUDA kernels (libtorch_cuda)")
  else()
    set(_cuda "CPU only")
  endif()
  message(STATUS "mpiddp: libtorch ${Torch_VERSION}, ${_cuda}: ${_library}")
endmacro()

# NCCL's version as its header states it ("2.28.9").
function(mpiddp_nccl_version header out)
  foreach(part MAJOR MINOR PATCH)
    file(STRINGS ${header} line REGEX "^#define NCCL_${part}[ \t]+[0-9]+")
    string(REGEX REPLACE ".*NCCL_${part}[ \t]+([0-9]+).*" "\\1" ${part} "${line}")
  endforeach()
  set(${out} "${MAJOR}.${MINOR}.${PATCH}" PARENT_SCOPE)
endfunction()
