# The software stacks the benchmarks compare mpiddp on, each rule here once (sourced by
# bench/train_bench.sh and bench/lm_bench.sh):
#   debian12  this machine: Debian 12's libtorch/python3-torch 1.13, mpiddp in the caller's BUILD_DIR
#   sid       the Debian sid chroot of scripts/chroot.sh: libtorch/python3-torch 2.14, build-sid
#   pip       PyTorch's wheel (torch 2.11, CUDA 13 build) in the venv of scripts/build_pip.sh, build-pip;
#             the Python contenders run that venv's python, so both sides run the same torch

stack_build() {  # stack_build STACK BUILD_DIR -> the build directory of that stack
  case $1 in
    debian12) echo "$2" ;;
    sid) echo build-sid ;;
    pip) echo build-pip ;;
    *) echo "bench: error: unknown stack '$1' (debian12, sid, pip)" >&2; return 2 ;;
  esac
}

# build_stacks BUILD_DIR STACK...: builds mpiddp with its bench programs (and what the Python side
# needs) on each; a test run may have configured a build without them (MPIDDP_BUILD_BENCH=OFF).
build_stacks() {
  local build=$1 stack
  shift
  for stack in "$@"; do
    case $stack in
      debian12) bash scripts/build.sh "$build" -DMPIDDP_BUILD_BENCH=ON >&2 ;;
      sid) bash scripts/chroot.sh -- bash -c 'bash scripts/deps.sh python3-torch python3-h5py time &&
             bash scripts/build.sh build-sid -DMPIDDP_BUILD_BENCH=ON' >&2 ;;
      pip) bash scripts/build_pip.sh build-pip -DMPIDDP_BUILD_BENCH=ON >&2 ;;
      *) stack_build "$stack" "$build" >/dev/null || exit 2 ;;
    esac
  done
}

on_stack() {  # on_stack STACK COMMAND...: runs COMMAND where that stack lives
  local stack=$1
  shift
  case $stack in
    debian12) "$@" ;;
    sid) bash scripts/chroot.sh -- "$@" ;;
    pip) MPIDDP_BENCH_PYTHON=${MPIDDP_PYTHON:-$PWD/build-pip/venv/bin/python} "$@" ;;
  esac
}
