# One helper per kind of test, so every test gets the same flags, timeout and labels.
#   mpiddp_add_unit_tests(NAME SOURCES...)                one gtest program, one CTest entry per
#                                                          source (unit.FILE), label "unit"
#   mpiddp_add_mpi_test(NAME SOURCES... [RANKS 1 2 3 4] [LIBRARIES ...] [GPU_CASES FILTER])
#                                                          one executable, one CTest entry per rank
#                                                          count, label "mpi"; with MPIDDP_GPU_TESTS=ON
#                                                          (scripts/gpu.sh) also its GPU cases again
#                                                          under MPIDDP_REQUIRE_GPU=1: the suites
#                                                          named *Cuda and GPU_CASES (a gtest filter),
#                                                          mpi.NAME.gpu.np1 and np2, label "gpu"
#   mpiddp_add_script_test(NAME SCRIPT [ARGS...])         bash script, label "system"
# tests/README.md says how to add each kind.
# Further labels, given in tests/CMakeLists.txt, choose what each stage of scripts/test.sh runs:
#   torch    a system test whose result depends on the torch the build uses (libtorch's version,
#            CUDA, NCCL, the Python side's torch): the pip stage runs these with the unit and MPI tests
#   cluster  a system test that needs this machine's own services (a Slurm cluster in namespaces,
#            the module systems): the sid chroot leaves these out

set(MPIDDP_TEST_TIMEOUT 180 CACHE STRING "Per-test timeout in seconds")
set(MPIDDP_TEST_RANKS 1 2 3 4 CACHE STRING "Rank counts every MPI test runs at")
# Off by default: the GPU entries fail (not skip) where there is no GPU, so a plain `ctest` on a CPU
# machine stays green; the GPU cases still run, or skip, inside the ordinary MPI entries.
option(MPIDDP_GPU_TESTS "Register the GPU cases as CTest entries labelled gpu that fail without a GPU" OFF)

# Open MPI refuses more ranks than cores without --oversubscribe, and root without its consent
# variables; other MPIs need neither (and reject the flag).
set(MPIDDP_MPIEXEC_FLAGS ${MPIEXEC_PREFLAGS})
set(MPIDDP_TEST_ENVIRONMENT "")
if(MPIDDP_OPENMPI)
  list(APPEND MPIDDP_MPIEXEC_FLAGS --oversubscribe)
  list(APPEND MPIDDP_TEST_ENVIRONMENT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
       OMPI_MCA_rmaps_base_oversubscribe=1)
endif()
if(MPIDDP_SANITIZE)
  # MPI libraries keep allocations alive until exit by design; leaks there are not ours.
  list(APPEND MPIDDP_TEST_ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"
       "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()

# The tests' own code compiles without optimisation (-O0 after the build type's flags): what they
# exercise is the library, built as the build type says; a test file took 26 s at -O2 and 15 s at
# -O0 here, 10 s of either reading the precompiled header.
set(MPIDDP_TEST_COMPILE_OPTIONS -Wall -Wextra -O0)

add_library(mpiddp_gtest_mpi_main STATIC ${PROJECT_SOURCE_DIR}/tests/support/gtest_mpi_main.cpp)
target_include_directories(mpiddp_gtest_mpi_main PUBLIC ${PROJECT_SOURCE_DIR}/tests/support)
target_link_libraries(mpiddp_gtest_mpi_main PUBLIC mpiddp GTest::gtest)
target_compile_options(mpiddp_gtest_mpi_main PRIVATE ${MPIDDP_TEST_COMPILE_OPTIONS})
# libtorch's and GoogleTest's headers are most of each test's compile time: precompiled once, with
# the tests' own flags, in mpiddp_gtest_mpi_main, and reused by every test executable.
if(MPIDDP_PRECOMPILE_HEADERS)
  target_precompile_headers(mpiddp_gtest_mpi_main PRIVATE <torch/torch.h> <gtest/gtest.h>)
endif()
# Every test builds against HDF5 (its headers, definitions and libraries; on sid its CMake package's
# _FILE_OFFSET_BITS, _GNU_SOURCE, ...; no definitions on Debian 12): the HDF5 tests need it, and GCC
# takes the shared header only with the same macros.
target_include_directories(mpiddp_gtest_mpi_main PRIVATE ${HDF5_C_INCLUDE_DIRS})
target_compile_definitions(mpiddp_gtest_mpi_main PRIVATE ${HDF5_C_DEFINITIONS})
target_link_libraries(mpiddp_gtest_mpi_main PRIVATE ${HDF5_C_LIBRARIES})

# Every test program, the helpers that are no gtest too, compiles with GoogleTest's definitions
# (GTEST_HAS_PTHREAD): a macro the precompiled header saw must be defined alike, or GCC ignores it.
function(_mpiddp_test_target name)
  add_executable(${name} ${ARGN})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_options(${name} PRIVATE ${MPIDDP_TEST_COMPILE_OPTIONS})
  target_link_libraries(${name} PRIVATE GTest::gtest)
  target_include_directories(${name} PRIVATE ${HDF5_C_INCLUDE_DIRS})
  target_compile_definitions(${name} PRIVATE ${HDF5_C_DEFINITIONS})
  target_link_libraries(${name} PRIVATE ${HDF5_C_LIBRARIES})
  # One source each: a unity build (CMAKE_UNITY_BUILD) gains nothing here, and a test's fixtures in
  # its anonymous namespace would draw -Wsubobject-linkage once the file is not the unit's main file.
  set_target_properties(${name} PROPERTIES UNITY_BUILD OFF)
  if(MPIDDP_PRECOMPILE_HEADERS)
    target_precompile_headers(${name} REUSE_FROM mpiddp_gtest_mpi_main)
  endif()
endfunction()

# The executables of the unit and MPI tests alone (scripts/test.sh's ASan stage builds just these).
add_custom_target(mpiddp_unit_mpi_tests)

# The gtest filter (into OUT) that selects the suites SOURCE defines, or those whose name matches
# SUITE_REGEX: every line that starts with TEST, TEST_F, TEST_P, TYPED_TEST or TYPED_TEST_P names a
# suite. gtest's full names differ by macro: Suite.Name (TEST, TEST_F), Prefix/Suite.Name/param
# (TEST_P), Suite/type.Name (TYPED_TEST) and Prefix/Suite/type.Name (TYPED_TEST_P); an empty prefix
# drops "Prefix/". A program's suite names are unique, so a suite picks its file.
function(_mpiddp_gtest_filter out source)
  cmake_parse_arguments(ARG "" "SUITE_REGEX" "" ${ARGN})
  get_filename_component(source "${source}" ABSOLUTE)
  file(STRINGS "${source}" lines REGEX "^(TYPED_TEST_P|TYPED_TEST|TEST_P|TEST_F|TEST) *\\( *[A-Za-z0-9_]+ *,")
  set(patterns "")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "^([A-Z_]+) *\\( *([A-Za-z0-9_]+)" _ "${line}")
    set(macro ${CMAKE_MATCH_1})
    set(suite ${CMAKE_MATCH_2})
    if(DEFINED ARG_SUITE_REGEX AND NOT suite MATCHES "${ARG_SUITE_REGEX}")
      continue()
    endif()
    if(macro STREQUAL "TEST_P")
      list(APPEND patterns "${suite}.*" "*/${suite}.*")
    elseif(macro STREQUAL "TYPED_TEST")
      list(APPEND patterns "${suite}/*")
    elseif(macro STREQUAL "TYPED_TEST_P")
      list(APPEND patterns "${suite}/*" "*/${suite}/*")
    else()
      list(APPEND patterns "${suite}.*")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES patterns)
  string(JOIN ":" filter ${patterns})
  set(${out} "${filter}" PARENT_SCOPE)
endfunction()

# The unit tests are one program: each test file alone paid ~10 s for reading the precompiled
# header, and twenty of them cost a build stage ~5 minutes of compile time; built in unity batches of
# ten files they cost two compilations. Each source file keeps its CTest entry, unit.FILE, which runs
# the suites the file defines (--gtest_filter, _mpiddp_gtest_filter); a filter that selects nothing
# fails (a file whose tests all skip, as test_allocator's under ASan, passes).
function(mpiddp_add_unit_tests name)
  _mpiddp_test_target(${name} ${ARGN})
  set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 10)
  # Fixtures in the anonymous namespace of a file that is not the unity unit's main file.
  target_compile_options(${name} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
  add_dependencies(mpiddp_unit_mpi_tests ${name})
  target_link_libraries(${name} PRIVATE mpiddp GTest::gtest_main)
  foreach(source IN LISTS ARGN)
    get_filename_component(file ${source} NAME_WE)
    _mpiddp_gtest_filter(filter ${source})
    add_test(NAME unit.${file} COMMAND ${name} --gtest_filter=${filter})
    set_tests_properties(unit.${file} PROPERTIES TIMEOUT ${MPIDDP_TEST_TIMEOUT} LABELS unit
                         ENVIRONMENT "${MPIDDP_TEST_ENVIRONMENT}" FAIL_REGULAR_EXPRESSION "Running 0 tests from")
  endforeach()
endfunction()

function(mpiddp_add_mpi_test name)
  cmake_parse_arguments(ARG "" "GPU_CASES" "SOURCES;RANKS;LIBRARIES" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${MPIDDP_TEST_RANKS})
  endif()
  _mpiddp_test_target(${name} ${ARG_SOURCES})
  add_dependencies(mpiddp_unit_mpi_tests ${name})
  target_link_libraries(${name} PRIVATE mpiddp_gtest_mpi_main ${ARG_LIBRARIES})
  foreach(n IN LISTS ARG_RANKS)
    add_test(NAME mpi.${name}.np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIDDP_MPIEXEC_FLAGS}
                     $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(mpi.${name}.np${n} PROPERTIES TIMEOUT ${MPIDDP_TEST_TIMEOUT} LABELS mpi
                         PROCESSORS ${n} ENVIRONMENT "${MPIDDP_TEST_ENVIRONMENT}")
  endforeach()
  if(MPIDDP_GPU_TESTS)
    set(gpu_filter ${ARG_GPU_CASES})
    foreach(source IN LISTS ARG_SOURCES)
      _mpiddp_gtest_filter(cuda_suites ${source} SUITE_REGEX "Cuda$")
      if(cuda_suites)
        list(APPEND gpu_filter ${cuda_suites})
      endif()
    endforeach()
    if(gpu_filter)
      string(JOIN ":" gpu_filter ${gpu_filter})
      _mpiddp_add_gpu_cases(${name} "${gpu_filter}")
    endif()
  endif()
endfunction()

# The GPU cases of MPI test NAME (a gtest filter) at 1 and 2 ranks. A GPU case under
# MPIDDP_REQUIRE_GPU=1 fails instead of skipping where a GPU is missing (mpi_test.hpp), so
# `ctest -L gpu` passes only where every case ran. A filter that selects nothing (a renamed case)
# passes nothing: "[  PASSED  ] 0 tests" fails the entry.
function(_mpiddp_add_gpu_cases name filter)
  foreach(n 1 2)
    add_test(NAME mpi.${name}.gpu.np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIDDP_MPIEXEC_FLAGS}
                     $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS} --gtest_filter=${filter})
    set_tests_properties(mpi.${name}.gpu.np${n} PROPERTIES TIMEOUT ${MPIDDP_TEST_TIMEOUT} LABELS gpu
                         PROCESSORS ${n} ENVIRONMENT "${MPIDDP_TEST_ENVIRONMENT};MPIDDP_REQUIRE_GPU=1"
                         FAIL_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests")
  endforeach()
endfunction()

# The Python that the system tests' Python side runs (TorchScript models and exports, the PyTorch
# references, TensorBoard and HDF5 read-back): it needs torch, h5py and protobuf. Debian's by default
# (python3-torch, python3-h5py); the pip stack names its venv's, so the references run the same torch.
set(MPIDDP_TEST_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch, h5py and protobuf for the system tests")

string(JOIN " " _mpiddp_flags_text ${MPIDDP_MPIEXEC_FLAGS})
set(MPIDDP_BACKENDS_TEXT "mpi")
if(MPIDDP_HAS_NCCL)
  string(APPEND MPIDDP_BACKENDS_TEXT " nccl")
endif()
if(MPIDDP_HAS_GLOO)
  string(APPEND MPIDDP_BACKENDS_TEXT " gloo")
endif()
# System tests run for seconds to minutes, unit and MPI tests for seconds: with COST 1 CTest starts
# them first (until it has timings of its own); tests/CMakeLists.txt gives the longest their seconds.
function(mpiddp_add_script_test name script)
  add_test(NAME system.${name} COMMAND bash ${script} ${ARGN})
  set_tests_properties(system.${name} PROPERTIES TIMEOUT ${MPIDDP_TEST_TIMEOUT} LABELS system COST 1
                       ENVIRONMENT "${MPIDDP_TEST_ENVIRONMENT};MPIEXEC=${MPIEXEC_EXECUTABLE};MPIEXEC_FLAGS=${_mpiddp_flags_text};MPIDDP_TEST_PYTHON=${MPIDDP_TEST_PYTHON}")
endfunction()
