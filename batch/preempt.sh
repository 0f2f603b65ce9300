#!/bin/bash
# Preemption-safe training: Slurm sends SIGUSR1 120 s before the time limit (and SIGTERM on
# preemption); every mpiddp rank stops at the same step boundary, rank 0 writes a snapshot, all exit
# 0. This script then requeues the job unless training finished; the requeued job (same script)
# resumes from the newest valid snapshot ("Resuming training from snapshot at Epoch N").
# `sbatch preempt.sh`. Environment it reads (all optional): MPIDDP_MODULES (default:
# mpi/openmpi-4.1.5 mpiddp; empty: none), MPIDDP_DATA_DIR, MPIDDP_RUN_DIR (default
# ./mpiddp-run-<job id>: the same across requeues), MPIDDP_EPOCHS (default 20), MPIDDP_TRAIN_ARGS.
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH -o %j.log
#SBATCH --job-name=mpiddp-preempt

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
echo "restart count: ${SLURM_RESTART_COUNT:-0}"

# Slurm signals the job step's processes (mpiddp's ranks); mpirun also forwards a SIGUSR1 it gets.
mpirun --bind-to none mpiddp train --model mlp --data "$data/synthetic.h5" --epochs "${MPIDDP_EPOCHS:-20}" \
  --batch-size 32 --optimizer sgd --momentum 0.9 --lr 0.01 --snapshot-dir "$run/snapshots" --resume auto \
  --metrics "$run/metrics.jsonl" ${MPIDDP_TRAIN_ARGS:-} | tee "$run/train.out"

if grep -q '^stopped by SIG' "$run/train.out"; then
  echo "stopped early at a snapshot: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
