#!/bin/bash
# Direct launch by Slurm: `srun --mpi=pmix` starts the ranks itself (no mpirun, no orted); MPI
# learns rank and size from PMIx. mpiddp checks that MPI's size equals SLURM_NTASKS, so a Slurm
# without PMI support fails loudly instead of training N separate models. `sbatch srun.sh`.
# Environment it reads (all optional): MPIDDP_MODULES (default: mpi/openmpi-4.1.5 mpiddp; empty:
# none), MPIDDP_MPI (srun's --mpi plugin, default pmix), MPIDDP_DATA_DIR, MPIDDP_RUN_DIR,
# MPIDDP_EPOCHS (default 20), MPIDDP_TRAIN_ARGS.
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH -o %j.log
#SBATCH --job-name=mpiddp-srun

source /etc/profile
modules=${MPIDDP_MODULES-mpi/openmpi-4.1.5 mpiddp}
[ -n "$modules" ] && module load $modules
set -euo pipefail

data=${MPIDDP_DATA_DIR:-$HOME/data}
run=${MPIDDP_RUN_DIR:-$PWD/mpiddp-run-${SLURM_JOB_ID:-local}}
mkdir -p "$data" "$run"
[ -f "$data/synthetic.h5" ] || mpiddp data synthetic --samples 2048 --features 20 --seed 0 --out "$data/synthetic.h5"

mpi=${MPIDDP_MPI:-pmix}
srun --mpi="$mpi" --label mpiddp info
srun --mpi="$mpi" mpiddp train --model linear --data "$data/synthetic.h5" --epochs "${MPIDDP_EPOCHS:-20}" \
  --batch-size 32 --optimizer sgd --lr 0.001 --snapshot-dir "$run/snapshots" --metrics "$run/metrics.jsonl" \
  ${MPIDDP_TRAIN_ARGS:-}
