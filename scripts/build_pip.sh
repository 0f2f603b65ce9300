#!/usr/bin/env bash
# Builds mpiddp against PyTorch's own pip wheel, with CUDA and the NCCL backend ON: the pip stack.
#   usage: scripts/build_pip.sh [BUILD_DIR] [extra cmake -D options...]     (default build-pip)
# The torch comes from MPIDDP_PYTHON (a python whose torch you already have: a venv, conda, a GPU
# image) or else from a venv made for you in BUILD_DIR/venv by scripts/venv.sh (torch==2.11.0 from
# PyPI, CUDA 13 build; MPIDDP_TORCH_VERSION picks another). The system tests' Python side then runs
# with that same Python (MPIDDP_TEST_PYTHON), so the PyTorch references use the torch mpiddp links.
# MPIDDP_PREFIX_PATH adds prefixes to search for the other dependencies (scripts/gpu.sh: its own).
#
# What links against what: libtorch, libtorch_cuda and NCCL are the wheel's (NCCL from the nvidia-nccl
# wheel beside torch: the library libtorch_cuda itself loads, so the process has one NCCL, the version
# torch.cuda.nccl.version() reports). The CUDA toolkit (/usr/local/cuda, or CUDAToolkit_ROOT) gives
# nvcc and the CUDA headers, which the wheels do not carry, and the CUDA runtime mpiddp links, as
# PyTorch's own C++ extensions do: one libcudart.so.13 is loaded at run time, the same CUDA 13 ABI.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-pip}
shift || true
py=${MPIDDP_PYTHON:-}
[ -n "$py" ] || py=$(bash scripts/venv.sh "$build/venv")
torch_cmake=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)') || {
  echo "build_pip.sh: error: $py has no torch (pip install torch, or leave MPIDDP_PYTHON unset)" >&2
  exit 1
}
echo "== pip stack: $("$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)') ($torch_cmake)"
# PyTorch's way: its share/cmake as a prefix, where TorchConfig finds Caffe2Config beside it (a bare
# Torch_DIR lets a system libtorch's Caffe2 answer; the package directory as a prefix lends the
# wheel's own protoc and protobuf headers to find_package(Protobuf)).
bash scripts/build.sh "$build" -DCMAKE_PREFIX_PATH="$torch_cmake${MPIDDP_PREFIX_PATH:+;$MPIDDP_PREFIX_PATH}" -DMPIDDP_WITH_NCCL=ON \
  -DMPIDDP_TEST_PYTHON="$(command -v "$py")" "$@"
