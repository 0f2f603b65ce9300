#!/usr/bin/env bash
# The whole test suite, from a fresh clone, on three stacks: install what is missing, build, run every
# test (unit, MPI at 1-4 ranks, system, install) against Debian 12's libtorch 1.13; then build and
# test again against Debian sid's libtorch 2.14 inside a chroot (scripts/chroot.sh; made on first use,
# ~10 min, reused after) and against PyTorch's own pip wheel (torch 2.11, CUDA 13, NCCL backend ON;
# scripts/build_pip.sh, its venv made on first use in build-pip/venv, ~1 min, reused after): there
# the unit and MPI tests and the system tests that depend on the stack; then rebuild with ASan+UBSan
# and run the unit and MPI tests again.
# Ends with each stage's wall time. Exit status non-zero on any failure. usage: scripts/test.sh
# MPIDDP_SKIP_SID=1, MPIDDP_SKIP_PIP=1 or MPIDDP_SKIP_SANITIZERS=1 leave out a stage (CI runs all four).
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite also needs: a Slurm cluster (slurm-wlm, munge, iproute2), both module systems
# (environment-modules; Lmod's dependencies, Lmod itself unpacked by scripts/lmod.sh), h5py,
# python3-protobuf (reads TensorBoard files back), python3-torch (the TorchScript models and the
# Python references of system.torchscript_cli and system.example).
start=$SECONDS
bash scripts/deps.sh slurm-wlm munge iproute2 environment-modules lua5.3 lua-posix lua-filesystem lua-json \
  lua-term tcl python3-h5py python3-protobuf python3-torch
bash scripts/lmod.sh build/lmod
jobs=$(nproc)
# Each stage's wall time, said at the end (CI must finish within 90 minutes on a fresh machine).
times=()
record() { times+=("$(printf '%-52s %5d s' "$1" "$2")"); }  # record NAME SECONDS
record "dependencies (Debian packages, Lmod)" $((SECONDS - start))
timed() {  # timed NAME FUNCTION: runs FUNCTION, records its wall time under NAME
  local start=$SECONDS
  "$2"
  record "$1" $((SECONDS - start))
}

# How every stage builds: -Werror; RelWithDebInfo's -O2 code without its debug information, which
# is a quarter of the compile time (a failing test names its check; ASan's reports keep their lines);
# a unity build, which compiles the library's units eight to a file and takes a third less time.
# The stages after the first build no bench/ programs: no test runs them, and Debian 12's stage
# compiles them with -Werror.
build_flags=(-DMPIDDP_WARNINGS_AS_ERRORS=ON "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" -DCMAKE_UNITY_BUILD=ON)
stage_flags=("${build_flags[@]}" -DMPIDDP_BUILD_BENCH=OFF)

# The later stages' downloads (the sid chroot, the pip venv: network and disk more than CPU) are
# made while the first stage builds; a stage that finds one missing makes it itself.
prefetch() {
  [ "${MPIDDP_SKIP_SID:-0}" = 1 ] || bash scripts/chroot.sh --suite sid -- true
  # (no venv where MPIDDP_PYTHON names the torch build_pip.sh uses: scripts/build_pip.sh)
  [ "${MPIDDP_SKIP_PIP:-0}" = 1 ] || [ -n "${MPIDDP_PYTHON:-}" ] || bash scripts/venv.sh build-pip/venv
}
prefetch >build/prefetch.log 2>&1 &
prefetching=$!
trap 'wait $prefetching 2>/dev/null || true' EXIT

debian12() {
  echo "== build (RelWithDebInfo without debug information, warnings as errors)"
  bash scripts/build.sh build "${build_flags[@]}" -DMPIDDP_BUILD_BENCH=ON
  echo "== tests"
  ctest --test-dir build --output-on-failure -j "$jobs"
}

sid() {
  echo "== Debian sid chroot: libtorch 2.x build and tests"
  bash scripts/chroot.sh --suite sid -- bash scripts/test_stack.sh build-sid "${stage_flags[@]}"
}

pip_wheel() {
  echo "== pip stack: PyTorch's wheel in a venv, CUDA and NCCL backend ON"
  bash scripts/build_pip.sh build-pip "${stage_flags[@]}"
  # system.info_cli holds the build to this torch's CUDA and NCCL: here that torch must have both.
  # It is the build's: the Python whose torch build_pip.sh configured against (its venv's or MPIDDP_PYTHON).
  local py
  py=$(sed -n 's/^MPIDDP_TEST_PYTHON:FILEPATH=//p' build-pip/CMakeCache.txt)
  "$py" -c 'import torch, torch.distributed as d
assert torch.version.cuda and d.is_nccl_available(), f"the pip stack needs a CUDA torch with NCCL, not {torch.__version__}"'
  # What the wheel decides: the unit and MPI tests, and the system tests where libtorch's version,
  # its CUDA/NCCL or the Python side's torch matter (info, install, snapshots and bitwise resume,
  # TorchScript and exports, the GPT against nanoGPT, TensorBoard beside the wheel's protobuf, the
  # examples). Open MPI, HDF5 and the module systems are Debian 12's here as in the first stage: what
  # only they decide (the Slurm cluster, modules, the bench and data commands, stall and timeout
  # handling, the training CLI's options and faults, ZeRO's collectives) ran there and on sid.
  ctest --test-dir build-pip --output-on-failure -j "$jobs" -E \
    "system\.(slurm_jobs|slurm_partition|modules|bench_cli|data_cli|stall|comm_timeout|harness_reports|train_cli|zero_cli)$"
}

sanitizers() {
  # Not a unity build: each source file compiles alone here, so one that leans on the includes of
  # the files it is batched with in the other stages is caught.
  echo "== build (ASan + UBSan)"
  MPIDDP_BUILD_TARGETS=mpiddp_unit_mpi_tests bash scripts/build.sh build-asan -DMPIDDP_SANITIZE=ON \
    -DCMAKE_BUILD_TYPE=Debug -DMPIDDP_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_DEBUG=-g1
  echo "== tests under ASan + UBSan (unit, mpi)"
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "unit|mpi"
}

timed "Debian 12, libtorch 1.13: build, whole suite" debian12
wait $prefetching || echo "== (prefetch failed, the stages retry; build/prefetch.log: $(tail -1 build/prefetch.log))"
[ "${MPIDDP_SKIP_SID:-0}" = 1 ] || timed "Debian sid chroot, libtorch 2.14: build, tests" sid
[ "${MPIDDP_SKIP_PIP:-0}" = 1 ] || timed "pip wheel, torch 2.11 CUDA 13: build, tests" pip_wheel
[ "${MPIDDP_SKIP_SANITIZERS:-0}" = 1 ] || timed "ASan + UBSan: build, unit and MPI tests" sanitizers
record total "$SECONDS"
echo "== stage times"
printf '%s\n' "${times[@]}"
