#!/bin/bash
# A Python training script of your own, the torchrun kind, on Slurm: `LLsub python.sh` or
# `sbatch python.sh`. mpirun starts `mpiddp launch` on every rank, which gives the script torchrun's
# environment (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...) from MPI
# alone: no MASTER_ADDR, no free-port one-liner, no torchrun rendezvous. The script calls
# torch.distributed.init_process_group() as it would under torchrun.
# Environment it reads (all optional):
#   MPIDDP_MODULES   modules to load (default SuperCloud's toolchain + mpiddp; empty: none)
#   MPIDDP_PYTHON    the Python with your torch (default: python3 on PATH after the modules)
#   MPIDDP_SCRIPT    the script and its arguments (default: train.py in the submit directory)
#   MPIDDP_LAUNCH_ARGS  extra `mpiddp launch` options (e.g. --print-env)
#   MPIDDP_LAUNCHER  mpirun (default) | srun (Slurm's own launch through PMIx: srun --mpi=$MPIDDP_MPI, default pmix)
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:volta:2
#SBATCH --distribution=nopack
#SBATCH -o %j.log
#SBATCH --job-name=mpiddp-python

source /etc/profile
modules=${MPIDDP_MODULES-anaconda/2023a mpi/openmpi-4.1.5 cuda/11.6 nccl/2.11.4-cuda11.6 mpiddp}
[ -n "$modules" ] && module load $modules
set -euo pipefail
# mpirun's lost-node detection (docs/cluster.md): these lines in every batch/ script that runs mpirun
# (Slurm runs a copy of the script, without its siblings; system.slurm_jobs checks that they agree).
export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-60}
export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-10}
export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}

MPI_FLAGS="--tag-output --bind-to none"  # the script's torch threads (OMP_NUM_THREADS) share the node's cores
python=${MPIDDP_PYTHON:-python3}
# shellcheck disable=SC2206
script=(${MPIDDP_SCRIPT:-train.py})
if [ "${MPIDDP_LAUNCHER:-mpirun}" = srun ]; then
  srun --mpi="${MPIDDP_MPI:-pmix}" mpiddp launch ${MPIDDP_LAUNCH_ARGS:-} -- "$python" "${script[@]}"
else
  mpirun ${MPI_FLAGS} mpiddp launch ${MPIDDP_LAUNCH_ARGS:-} -- "$python" "${script[@]}"
fi
