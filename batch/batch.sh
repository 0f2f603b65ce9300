#!/bin/bash
# mpiddp's MIT SuperCloud job: `LLsub batch.sh` or `sbatch batch.sh`. Two nodes x two ranks, one
# GPU per rank: mpirun starts mpiddp, and MPI alone gives every rank its rank, node, GPU and the
# NCCL communicator (no torchrun, no MASTER_ADDR). First the cluster check, then training that
# snapshots every epoch and resumes from the newest snapshot when the job is run again.
# Without GPUs: `sbatch --gres=none batch.sh` with MPIDDP_DEVICE=cpu (or use batch/cpu.sh).
# Environment it reads (all optional):
#   MPIDDP_MODULES   modules to load (default SuperCloud's toolchain + mpiddp; empty: none)
#   MPIDDP_DEVICE    cuda (default) | cpu        MPIDDP_EPOCHS  epochs (default 4)
#   MPIDDP_DATA_DIR  where the HDF5 files are (made from Fashion-MNIST if missing; default ~/data)
#   MPIDDP_RUN_DIR   snapshots and metrics (default ./mpiddp-run-<job id>)
#   MPIDDP_TRAIN_ARGS  extra `mpiddp train` options
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:volta:2
#SBATCH --distribution=nopack
#SBATCH -o %j.log
#SBATCH --job-name=mpiddp

source /etc/profile
modules=${MPIDDP_MODULES-anaconda/2023a mpi/openmpi-4.1.5 cuda/11.6 nccl/2.11.4-cuda11.6 mpiddp}
[ -n "$modules" ] && module load $modules
set -euo pipefail
# mpirun's lost-node detection (docs/cluster.md): these lines in every batch/ script that runs mpirun
# (Slurm runs a copy of the script, without its siblings; system.slurm_jobs checks that they agree).
export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-60}
export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-10}
export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}

MPI_FLAGS="--tag-output --bind-to socket -map-by core -x PSM2_GPUDIRECT=1 -x NCCL_NET_GDR_LEVEL=5 -x NCCL_P2P_LEVEL=5 -x NCCL_NET_GDR_READ=1"
device=${MPIDDP_DEVICE:-cuda}
backend=mpi
[ "$device" = cuda ] && backend=nccl
data=${MPIDDP_DATA_DIR:-$HOME/data}
run=${MPIDDP_RUN_DIR:-$PWD/mpiddp-run-${SLURM_JOB_ID:-local}}
mkdir -p "$data" "$run"

mpirun ${MPI_FLAGS} mpiddp info

# The bundled default data set (Debian: dataset-fashion-mnist), converted once.
[ -f "$data/fashion-mnist-train.h5" ] || mpiddp data fashion-mnist --out "$data/fashion-mnist.h5"

mpirun ${MPI_FLAGS} mpiddp train --model cnn --device "$device" --backend "$backend" \
  --data "$data/fashion-mnist-train.h5" --test-data "$data/fashion-mnist-test.h5" \
  --epochs "${MPIDDP_EPOCHS:-4}" --batch-size 64 --optimizer adam --lr 0.002 --lr-schedule cosine \
  --snapshot-dir "$run/snapshots" --metrics "$run/metrics.jsonl" ${MPIDDP_TRAIN_ARGS:-}
