#!/bin/bash
# The communication benchmark (the PARAM seed's comms check, nccl-tests' numbers): all-reduce,
# all-gather, reduce-scatter, all-to-all and broadcast bus bandwidth from 8 B to 256 MiB across two
# nodes, with a correctness check. GPUs and NCCL by default; MPIDDP_BACKEND=mpi for CPU nodes
# (then `sbatch --gres=none bench.sh`). Results as JSON in ./mpiddp-bench-<job id>/.
# Environment it reads (all optional): MPIDDP_MODULES (default SuperCloud's toolchain + mpiddp;
# empty: none), MPIDDP_BACKEND (nccl | mpi | gloo), MPIDDP_BENCH_ARGS (default -b 8 -e 256M -f 2).
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:volta:2
#SBATCH --distribution=nopack
#SBATCH -o %j.log
#SBATCH --job-name=mpiddp-bench

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
backend=${MPIDDP_BACKEND:-nccl}
out=$PWD/mpiddp-bench-${SLURM_JOB_ID:-local}
mkdir -p "$out"
for collective in allreduce allgather reduce_scatter alltoall broadcast; do
  mpirun ${MPI_FLAGS} mpiddp bench --backend "$backend" --collective "$collective" \
    ${MPIDDP_BENCH_ARGS:--b 8 -e 256M -f 2} -c 1 --json "$out/$collective.json"
done
