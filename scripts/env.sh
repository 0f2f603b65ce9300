# shellcheck shell=bash
# Sourced by the scripts: lets Open MPI run as root (CI and fresh machines run as root) and more
# ranks than cores, which is how these small machines run 4-rank tests.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
MPIRUN_FLAGS=()
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  MPIRUN_FLAGS+=(--oversubscribe)
fi
