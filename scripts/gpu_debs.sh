#!/usr/bin/env bash
# Downloads here (Debian 12, where the archive is reachable) the Debian packages that the GPU
# machine's image lacks to build and test mpiddp: Open MPI, HDF5 (+ its tools), Boost.Program_options,
# GoogleTest, nlohmann-json, Protobuf, with the libraries they load. scripts/gpu.sh unpacks them into a
# prefix there (nothing outside the GPU machine can be reached from it), with Fashion-MNIST. ~57 MiB.
# With GPU_LLMC_GIT (a clone of github.com/karpathy/llm.c, or its git directory), also llm.c's
# train_gpt2.cu, Makefile and llmc/ at that clone's HEAD (0.3 MiB), which gpu.sh's figures stage
# builds there as a peer; never part of this repository.
# usage: scripts/gpu_debs.sh [DIR]   (default .gpu-debs, ignored by git; carry it to the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-debs}
# What mpiddp builds and runs against. Open MPI 4.1's runtime libraries are listed by hand (the
# package dependencies would pull in compilers, Fortran and LLVM through alternatives).
core=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libmunge2 libxnvctrl0
  libhdf5-103-1 libhdf5-dev libhdf5-cpp-103-1 libhdf5-hl-100 libhdf5-hl-cpp-100 libsz2 libaec0 libaec-dev
  hdf5-tools libboost-program-options1.74.0 libboost-program-options1.74-dev libboost1.74-dev libgtest-dev
  nlohmann-json3-dev libprotobuf32 libprotobuf-dev libprotoc32 protobuf-compiler)
# Common system libraries: used there only where the image lacks the soname (gpu.sh checks).
fallback=(zlib1g-dev libcurl4 libnghttp2-14 librtmp1 libssh2-1 libpsl5 libbrotli1 libldap-2.5-0 libsasl2-2
  libnuma1 libpciaccess0 libltdl7 libnl-3-200 libnl-route-3-200 libibverbs1 librdmacm1)
rm -rf "$dir" && mkdir -p "$dir/core" "$dir/fallback"
compgen -G "/var/lib/apt/lists/*_Packages" >/dev/null || apt-get update
(cd "$dir/core" && apt-get download "${core[@]}")
(cd "$dir/fallback" && apt-get download "${fallback[@]}")
# Fashion-MNIST's IDX files (Debian's dataset-fashion-mnist), for `mpiddp data` and the tests there.
fm=/usr/share/datasets/fashion-mnist
[ -f "$fm/train-images-idx3-ubyte.gz" ] || bash scripts/deps.sh dataset-fashion-mnist
mkdir -p "$dir/fashion-mnist" && cp "$fm"/*.gz "$dir/fashion-mnist/"
if [ -n "${GPU_LLMC_GIT:-}" ]; then
  mkdir -p "$dir/llm.c"
  git --git-dir="$(git -C "$GPU_LLMC_GIT" rev-parse --absolute-git-dir)" archive HEAD Makefile train_gpt2.cu llmc |
    tar -x -C "$dir/llm.c"
  git -C "$GPU_LLMC_GIT" rev-parse --short HEAD >"$dir/llm.c/COMMIT"
fi
du -sh "$dir"
