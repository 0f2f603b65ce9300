#!/bin/bash
# CPU data-parallel training across nodes (the AWS CPU-DDP seed, without torchrun): two nodes x
# two ranks, each rank one core-set of intra-op threads (mpiddp divides a node's cores among its
# ranks), gradients all-reduced over MPI. The seeds' regression workload (2048 x 20, Linear(20, 1),
# SGD 1e-3, batch 32), with snapshots, so a rerun resumes ("Resuming training from snapshot at
# Epoch N"). `sbatch cpu.sh` (or `LLsub cpu.sh`).
# Environment it reads (all optional): MPIDDP_MODULES (default: mpi/openmpi-4.1.5 mpiddp; empty:
# none), MPIDDP_DATA_DIR, MPIDDP_RUN_DIR, MPIDDP_EPOCHS (default 50), MPIDDP_TRAIN_ARGS.
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --exclusive
#SBATCH -o %j.log
#SBATCH --job-name=mpiddp-cpu

source /etc/profile
modules=${MPIDDP_MODULES-mpi/openmpi-4.1.5 mpiddp}
[ -n "$modules" ] && module load $modules
set -euo pipefail
# mpirun's lost-node detection (docs/cluster.md): these lines in every batch/ script that runs mpirun
# (Slurm runs a copy of the script, without its siblings; system.slurm_jobs checks that they agree).
export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-60}
export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-10}
export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}

data=${MPIDDP_DATA_DIR:-$HOME/data}
run=${MPIDDP_RUN_DIR:-$PWD/mpiddp-run-${SLURM_JOB_ID:-local}}
mkdir -p "$data" "$run"
[ -f "$data/synthetic.h5" ] || mpiddp data synthetic --samples 2048 --features 20 --seed 0 --out "$data/synthetic.h5"

mpirun --tag-output --bind-to none mpiddp info
mpirun --bind-to none mpiddp train --model linear --data "$data/synthetic.h5" --device cpu --backend mpi \
  --epochs "${MPIDDP_EPOCHS:-50}" --batch-size 32 --optimizer sgd --lr 0.001 \
  --snapshot-dir "$run/snapshots" --save-every 10 --metrics "$run/metrics.jsonl" ${MPIDDP_TRAIN_ARGS:-}
