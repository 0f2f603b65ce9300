#!/usr/bin/env bash
# Installs the Debian 12 packages mpiddp needs, and only those that are missing (idempotent:
# a second run installs nothing and does not touch apt). Needs root, or sudo.
# CUDA and NCCL are not Debian packages: the NCCL backend is built when /usr/local/cuda has them.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git python3 hostname procps
  openmpi-bin libopenmpi-dev            # MPI: bootstrap and the mpi backend
  libtorch-dev                          # libtorch 1.13 (CPU)
  libopenblas0-openmp                   # an optimised BLAS behind libtorch's libblas.so.3 (Debian's
                                        # default is the reference BLAS: a GPT step 16x slower); the
                                        # OpenMP build obeys --threads, as libtorch's own threads do
  libgloo-dev                           # headers for libtorch's c10d Gloo backend
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5 (datasets, snapshots), h5dump/h5diff
  libboost-program-options-dev          # the CLI (and Boost's headers: Boost.CRC for TensorBoard files)
  libprotobuf-dev protobuf-compiler     # TensorBoard event files (src/log/tensorboard.proto)
  zlib1g-dev                            # gzip'd IDX files
  dataset-fashion-mnist                 # the bundled default data
  nlohmann-json3-dev                    # JSON output (info --json, bench --json, timelines)
  libgtest-dev                          # tests
  ccache                                # the compiler cache scripts/build.sh keeps outside the clone
)
packages+=("$@")  # callers may ask for more (e.g. the benchmarks' python3-torch)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} Debian packages present"
  exit 0
fi

echo "deps: installing ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
