# shellcheck shell=bash
# The software stacks mpiddp is built, tested and benchmarked on, each rule here once. Sourced (from
# the repository root) by scripts/test.sh and bench/lib.sh.
#   debian12  this machine: Debian 12's libtorch/python3-torch 1.13, Open MPI 4.1, HDF5 1.10; build/
#             (the benchmarks: the caller's BUILD_DIR)
#   sid       the Debian sid chroot of scripts/chroot.sh: libtorch/python3-torch 2.14, Open MPI and
#             HDF5 of sid, built in build-sid (the repository is mounted at the same path there)
#   pip       PyTorch's own wheel (torch 2.11, CUDA 13 build, NCCL backend ON) in the venv of
#             scripts/venv.sh, built by scripts/build_pip.sh in build-pip, on Debian 12's MPI and HDF5;
#             its Python (MPIDDP_PYTHON where given) runs the Python side, so both sides run one torch

# shellcheck disable=SC2034  # read by bench/lib.sh
MPIDDP_STACKS="debian12 sid pip"

stack_check() {  # stack_check STACK: fails (status 2) with one line unless STACK is a stack
  case $1 in
    debian12|sid|pip) ;;
    *) echo "error: unknown stack '$1' (debian12, sid, pip)" >&2; return 2 ;;
  esac
}

stack_dir() {  # stack_dir STACK [DEBIAN12_DIR] -> that stack's build directory
  stack_check "$1" || return
  case $1 in
    debian12) echo "${2:-build}" ;;
    sid) echo build-sid ;;
    pip) echo build-pip ;;
  esac
}

stack_python() {  # stack_python STACK -> the Python with that stack's torch (inside its chroot for sid)
  stack_check "$1" || return
  case $1 in
    debian12|sid) echo /usr/bin/python3 ;;
    pip) echo "${MPIDDP_PYTHON:-$PWD/build-pip/venv/bin/python}" ;;
  esac
}

stack_fetch() {  # stack_fetch STACK: makes what the stack downloads (the chroot, the venv), if missing
  stack_check "$1" || return
  case $1 in
    debian12) ;;
    sid) bash scripts/chroot.sh --suite sid -- true ;;
    # (no venv where MPIDDP_PYTHON names the torch build_pip.sh uses)
    pip) [ -n "${MPIDDP_PYTHON:-}" ] || bash scripts/venv.sh build-pip/venv >/dev/null ;;
  esac
}

# stack_build STACK DIR [cmake -D options...]: configures and builds mpiddp on the stack in DIR
# (DIR is the stack's own for sid and pip: stack_dir). MPIDDP_BUILD_TARGETS works as in build.sh
# on debian12 and pip (the chroot starts from an empty environment).
stack_build() {
  local stack=$1 dir=$2
  shift 2
  stack_check "$stack" || return
  case $stack in
    debian12) bash scripts/build.sh "$dir" "$@" ;;
    sid) bash scripts/chroot.sh --suite sid -- bash scripts/build.sh "$dir" "$@" ;;
    pip) bash scripts/build_pip.sh "$dir" "$@" ;;
  esac
}

on_stack() {  # on_stack STACK COMMAND...: runs COMMAND where that stack lives (MPIDDP_BENCH_PYTHON: its Python)
  local stack=$1
  shift
  stack_check "$stack" || return
  case $stack in
    debian12) "$@" ;;
    sid) bash scripts/chroot.sh --suite sid -- "$@" ;;
    pip) MPIDDP_BENCH_PYTHON=$(stack_python pip) "$@" ;;
  esac
}
