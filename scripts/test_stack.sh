#!/usr/bin/env bash
# Builds mpiddp against whatever libtorch, MPI and HDF5 this system has and runs the unit, MPI
# (1-4 ranks) and system tests; scripts/test.sh runs it inside the Debian sid chroot. The tests
# labelled cluster (the two-node Slurm cluster, the network partition, the module systems) stay with
# the Debian 12 stage: a chroot shares the host's network and has no Slurm or module system of its own;
# so do those labelled own, which only mpiddp's code decides, and those labelled python, which the
# Debian 12 and pip stages decide (tests/CMakeLists.txt).
#   usage: scripts/test_stack.sh BUILD_DIR [extra cmake -D options...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/test_stack.sh BUILD_DIR [extra cmake -D options...]}
shift
echo "== $(. /etc/os-release && echo "$PRETTY_NAME"): $(g++ --version | head -1), libtorch-dev $(
  dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '(not a Debian package)')"
bash scripts/build.sh "$build" -DMPIDDP_WARNINGS_AS_ERRORS=ON "$@"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -LE '^(cluster|own|python)$'
