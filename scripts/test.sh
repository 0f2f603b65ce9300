#!/usr/bin/env bash
# The test suite, from a fresh clone, in four stages (scripts/stacks.sh defines the stacks):
#   debian12  install what is missing, build, run every test (unit, MPI at 1-4 ranks, system, install,
#             the Slurm cluster and both module systems) against Debian 12's libtorch 1.13
#   sid       build and test again against Debian sid's libtorch 2.14 inside a chroot (scripts/chroot.sh;
#             made on first use, ~10 min, reused after): all but labels cluster, own and python
#   pip       against PyTorch's own pip wheel (torch 2.11, CUDA 13, NCCL backend ON; scripts/build_pip.sh,
#             its venv made on first use in build-pip/venv, ~1 min, reused after): the unit tests, the
#             MPI tests at 2 and 3 ranks and the system tests that depend on the torch (label torch)
#   asan      rebuild with ASan+UBSan and run the unit and MPI tests again
#   usage: scripts/test.sh [STAGE...]     (no STAGE: all four, in this order)
# Each stage runs alone from a fresh clone (it installs, fetches and configures what it needs). Ends
# with each stage's wall time. Exit status non-zero on any failure; 2 for an unknown stage.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stacks.sh
all_stages=(debian12 sid pip asan)
stages=("$@")
[ $# -gt 0 ] || stages=("${all_stages[@]}")
for s in "${stages[@]}"; do
  case " ${all_stages[*]} " in
    *" $s "*) ;;
    *) echo "test.sh: error: unknown stage '$s' (stages: ${all_stages[*]}; none for all)" >&2; exit 2 ;;
  esac
done
selected() { [[ " ${stages[*]} " == *" $1 "* ]]; }
jobs=$(nproc)
# Each stage's wall time, said at the end (CI must finish within 60 minutes on a fresh machine).
times=()
record() { times+=("$(printf '%-52s %5d s' "$1" "$2")"); }  # record NAME SECONDS
timed() {  # timed NAME FUNCTION: runs FUNCTION, records its wall time under NAME
  local start=$SECONDS
  "$2"
  record "$1" $((SECONDS - start))
}

# Debian 12's packages for the stages that build on this machine. The Debian 12 stage's suite also
# needs: a Slurm cluster (slurm-wlm, munge, iproute2), both module systems (environment-modules;
# Lmod's dependencies, Lmod itself unpacked by scripts/lmod.sh into build/lmod), h5py,
# python3-protobuf (reads TensorBoard files back), clang-format 14 (system.format), python3-torch (the
# TorchScript models and the Python references of system.torchscript_cli and system.example). The sid
# chroot installs its own.
if selected debian12 || selected pip || selected asan; then
  extra=()
  selected debian12 && extra=(slurm-wlm munge iproute2 environment-modules lua5.3 lua-posix lua-filesystem
                              lua-json lua-term tcl python3-h5py python3-protobuf python3-torch
                              clang-format)
  bash scripts/deps.sh "${extra[@]}"
  selected debian12 && bash scripts/lmod.sh build/lmod
  record "dependencies (Debian packages, Lmod)" "$SECONDS"
fi

# How every stage builds: -Werror; RelWithDebInfo's -O2 code without its debug information, which
# is a quarter of the compile time (a failing test names its check; ASan's reports keep their lines);
# a unity build, which compiles the library's units eight to a file and takes a third less time.
# Tests ON explicitly: scripts/main.sh configures a new build/ without them. The stages after the
# first build no bench/ programs: no test runs them, and Debian 12's stage compiles them with -Werror.
build_flags=(-DMPIDDP_WARNINGS_AS_ERRORS=ON "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" -DCMAKE_UNITY_BUILD=ON
             -DMPIDDP_BUILD_TESTS=ON)
stage_flags=("${build_flags[@]}" -DMPIDDP_BUILD_BENCH=OFF)

# The downloads of the sid and pip stages (the chroot, the venv: network and disk more than CPU) are
# made while the first stage runs; a stage that finds one missing makes it itself.
mkdir -p build-logs
prefetch=()
for s in "${stages[@]:1}"; do
  case $s in sid|pip) prefetch+=("$s") ;; esac
done
prefetching=
if [ ${#prefetch[@]} -gt 0 ]; then
  (for s in "${prefetch[@]}"; do stack_fetch "$s"; done) >build-logs/prefetch.log 2>&1 &
  prefetching=$!
  trap 'wait $prefetching 2>/dev/null || true' EXIT
fi
await_prefetch() {  # the chroot and the venv are not made twice at once
  [ -n "$prefetching" ] || return 0
  wait "$prefetching" || echo "== (prefetch failed, the stages retry; build-logs/prefetch.log: $(tail -1 build-logs/prefetch.log))"
  prefetching=
}

debian12() {
  echo "== build (RelWithDebInfo without debug information, warnings as errors)"
  stack_build debian12 build "${build_flags[@]}" -DMPIDDP_BUILD_BENCH=ON
  echo "== tests"
  ctest --test-dir build --output-on-failure -j "$jobs"
}

sid() {
  echo "== Debian sid chroot: libtorch 2.x build and tests"
  on_stack sid bash scripts/test_stack.sh build-sid "${stage_flags[@]}"
}

pip_wheel() {
  echo "== pip stack: PyTorch's wheel in a venv, CUDA and NCCL backend ON"
  # The MPI tests at 2 and 3 ranks (even and uneven splits): the wheel decides libtorch's part of them;
  # Open MPI is Debian 12's, whose stage runs them at 1-4.
  stack_build pip build-pip "${stage_flags[@]}" "-DMPIDDP_TEST_RANKS=2;3"
  # system.info_cli holds the build to this torch's CUDA and NCCL: here that torch must have both.
  # It is the build's: the Python whose torch build_pip.sh configured against (its venv's or MPIDDP_PYTHON).
  local py
  py=$(sed -n 's/^MPIDDP_TEST_PYTHON:FILEPATH=//p' build-pip/CMakeCache.txt)
  "$py" -c 'import torch, torch.distributed as d
assert torch.version.cuda and d.is_nccl_available(), f"the pip stack needs a CUDA torch with NCCL, not {torch.__version__}"
import importlib.util as u  # system.hf_export is registered only where these import (scripts/venv.sh installs them)
assert u.find_spec("transformers") and u.find_spec("safetensors"), "the pip stack needs transformers and safetensors"'
  # What the wheel decides: the unit and MPI tests, and the system tests labelled torch, where
  # libtorch's version, its CUDA/NCCL or the Python side's torch matter (tests/CMakeLists.txt says
  # which). Open MPI, HDF5 and the module systems are Debian 12's here as in the first stage: what
  # only they or mpiddp's own code decide (the Slurm cluster, modules, the bench and data commands,
  # stall and timeout handling, the training CLI's options and faults, ZeRO's collectives) runs
  # there and on sid.
  ctest --test-dir build-pip --output-on-failure -j "$jobs" -L '^(unit|mpi|torch)$'
}

sanitizers() {
  # Debug (-O0) with line tables (-g1), a unity build as the other stages. The MPI tests at 1-3
  # ranks: 3 splits unevenly (the padded shards and slices where an index can run past its end), 4
  # evenly as 2 does.
  echo "== build (ASan + UBSan)"
  MPIDDP_BUILD_TARGETS=mpiddp_unit_mpi_tests bash scripts/build.sh build-asan -DMPIDDP_SANITIZE=ON \
    -DCMAKE_BUILD_TYPE=Debug -DMPIDDP_BUILD_TESTS=ON -DMPIDDP_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
    -DCMAKE_UNITY_BUILD=ON "-DMPIDDP_TEST_RANKS=1;2;3"
  echo "== tests under ASan + UBSan (unit, mpi)"
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L '^(unit|mpi)$'
}

first=1
for s in "${stages[@]}"; do
  [ $first = 1 ] || await_prefetch
  first=0
  case $s in
    debian12) timed "Debian 12, libtorch 1.13: build, whole suite" debian12 ;;
    sid) timed "Debian sid chroot, libtorch 2.14: build, tests" sid ;;
    pip) timed "pip wheel, torch 2.11 CUDA 13: build, tests" pip_wheel ;;
    asan) timed "ASan + UBSan: build, unit and MPI tests" sanitizers ;;
  esac
done
record total "$SECONDS"
echo "== stage times"
printf '%s\n' "${times[@]}"
