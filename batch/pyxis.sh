#!/bin/bash
# Container launch through Pyxis/Enroot (the AWS seeds' way): Slurm starts the ranks inside the
# image with `srun --container-image` and PMIx, the host's network and GPUs are passed through.
# The image needs mpiddp installed (e.g. built with `make -f Makefile.llsc install PREFIX=/opt/mpiddp`
# in a Dockerfile) and an Open MPI built with PMIx, like the host's. `sbatch pyxis.sh`.
# Environment it reads: MPIDDP_IMAGE (default: ./mpiddp.sqsh, made by `enroot import`),
# MPIDDP_MOUNTS (default: $HOME/data:/data), MPIDDP_EPOCHS (default 4), MPIDDP_TRAIN_ARGS.
#SBATCH -N 2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH -o %j.log
#SBATCH --job-name=mpiddp-pyxis

set -euo pipefail
image=${MPIDDP_IMAGE:-$PWD/mpiddp.sqsh}
mounts=${MPIDDP_MOUNTS:-$HOME/data:/data}
container=(--container-image="$image" --container-mounts="$mounts" --no-container-mount-home)

# NCCL over EFA/InfiniBand: the variables travel into the container with the environment.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

srun --mpi=pmix "${container[@]}" --ntasks-per-node=1 bash -c \
  '[ -f /data/fashion-mnist-train.h5 ] || mpiddp data fashion-mnist --out /data/fashion-mnist.h5' 
srun --mpi=pmix "${container[@]}" mpiddp info
srun --mpi=pmix "${container[@]}" mpiddp train --model cnn --device cuda --backend nccl \
  --data /data/fashion-mnist-train.h5 --test-data /data/fashion-mnist-test.h5 --epochs "${MPIDDP_EPOCHS:-4}" \
  --batch-size 64 --optimizer adam --lr 0.002 --snapshot-dir /data/mpiddp-snapshots ${MPIDDP_TRAIN_ARGS:-}
