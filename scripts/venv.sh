#!/usr/bin/env bash
# A Python virtual environment with PyTorch's own wheel from PyPI: the third stack beside Debian 12
# (libtorch 1.13) and the sid chroot (2.14). torch==2.11.0 by default, the version the GPU machines
# carry; on Linux x86-64 PyPI's wheel is the CUDA 13 build, with NCCL and the CUDA runtime as
# nvidia-* wheels (~2.6 GB to download, ~6 GB installed), and it runs on a machine without a GPU.
# Also h5py, numpy and protobuf, which the Python side of the tests and benchmarks imports, and
# Hugging Face's transformers and safetensors (system.hf_export: `mpiddp export --format hf` and
# `train --init-from DIR` against GPT2LMHeadModel), at versions that work with that torch.
# Made once; a venv that already has that torch is reused (the download is not repeated), and
# given transformers and safetensors when it lacks those versions.
# Never touches the system's Python.
#   usage: scripts/venv.sh VENV_DIR       (env MPIDDP_TORCH_VERSION, default 2.11.0;
#                                          MPIDDP_TRANSFORMERS_VERSION 5.24.0, MPIDDP_SAFETENSORS_VERSION 0.8.0)
# Prints nothing on stdout but the venv's python, so that callers can write py=$(scripts/venv.sh DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: scripts/venv.sh VENV_DIR}
version=${MPIDDP_TORCH_VERSION:-2.11.0}
transformers_version=${MPIDDP_TRANSFORMERS_VERSION:-5.24.0}
safetensors_version=${MPIDDP_SAFETENSORS_VERSION:-0.8.0}
hf_packages=("transformers==$transformers_version" "safetensors==$safetensors_version")
py=$venv/bin/python
has_torch() { [ -x "$py" ] && [ "$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$version" ]; }
has_hf() {
  [ "$("$py" -c 'import transformers, safetensors; print(transformers.__version__, safetensors.__version__)' 2>/dev/null)" \
    = "$transformers_version $safetensors_version" ]
}
if ! has_torch; then
  bash scripts/deps.sh python3-venv >&2
  echo "== venv $venv: torch==$version from PyPI" >&2
  python3 -m venv "$venv" >&2
  "$py" -m pip install --quiet --no-cache-dir "torch==$version" numpy h5py protobuf "${hf_packages[@]}" >&2
  has_torch || { echo "venv.sh: error: torch $version did not install into $venv" >&2; exit 1; }
fi
if ! has_hf; then
  echo "== venv $venv: ${hf_packages[*]} from PyPI" >&2
  "$py" -m pip install --quiet --no-cache-dir "${hf_packages[@]}" >&2
  has_hf || { echo "venv.sh: error: ${hf_packages[*]} did not install into $venv" >&2; exit 1; }
  has_torch || { echo "venv.sh: error: installing ${hf_packages[*]} changed $venv's torch" >&2; exit 1; }
fi
echo "$py"
