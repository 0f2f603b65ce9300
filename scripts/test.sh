#!/usr/bin/env bash
# The whole test suite, from a fresh clone, on three stacks: install what is missing, build, run every
# test (unit, MPI at 1-4 ranks, system, install) against Debian 12's libtorch 1.13; then build and
# test again against Debian sid's libtorch 2.14 inside a chroot (scripts/chroot.sh; made on first use,
# ~10 min, reused after) and against PyTorch's own pip wheel (torch 2.11, CUDA 13, NCCL backend ON;
# scripts/build_pip.sh, its venv made on first use in build-pip/venv, ~1 min, reused after): there
# the unit and MPI tests and the system tests that depend on the stack; then rebuild with ASan+UBSan
# and run the unit and MPI tests again.
# Exit status non-zero on any failure. usage: scripts/test.sh
# MPIDDP_SKIP_SID=1, MPIDDP_SKIP_PIP=1 or MPIDDP_SKIP_SANITIZERS=1 leave out a stage (CI runs all four).
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite also needs: a Slurm cluster (slurm-wlm, munge, iproute2), both module systems
# (environment-modules; Lmod's dependencies, Lmod itself unpacked by scripts/lmod.sh), h5py,
# python3-protobuf (reads TensorBoard files back), python3-torch (the TorchScript models and the
# Python references of system.torchscript_cli and system.example).
bash scripts/deps.sh slurm-wlm munge iproute2 environment-modules lua5.3 lua-posix lua-filesystem lua-json \
  lua-term tcl python3-h5py python3-protobuf python3-torch
bash scripts/lmod.sh build/lmod
jobs=$(nproc)

echo "== build (RelWithDebInfo, warnings as errors)"
bash scripts/build.sh build -DMPIDDP_WARNINGS_AS_ERRORS=ON
echo "== tests"
ctest --test-dir build --output-on-failure -j "$jobs"

if [ "${MPIDDP_SKIP_SID:-0}" != 1 ]; then
  echo "== Debian sid chroot: libtorch 2.x build and tests"
  bash scripts/chroot.sh --suite sid -- bash scripts/test_stack.sh build-sid
fi

if [ "${MPIDDP_SKIP_PIP:-0}" != 1 ]; then
  echo "== pip stack: PyTorch's wheel in a venv, CUDA and NCCL backend ON"
  bash scripts/build_pip.sh build-pip -DMPIDDP_WARNINGS_AS_ERRORS=ON
  # Open MPI, HDF5 and the module systems are Debian 12's here as in the first stage: what only they
  # decide (the Slurm cluster, modules, the bench and data commands, stall and timeout handling) ran there.
  ctest --test-dir build-pip --output-on-failure -j "$jobs" \
    -E "system\.(slurm_jobs|slurm_partition|modules|bench_cli|data_cli|stall|comm_timeout|harness_reports)$"
fi

if [ "${MPIDDP_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== build (ASan + UBSan)"
  bash scripts/build.sh build-asan -DMPIDDP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
  echo "== tests under ASan + UBSan (unit, mpi)"
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "unit|mpi"
fi
