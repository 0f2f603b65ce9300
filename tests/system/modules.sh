#!/usr/bin/env bash
# Makefile.llsc and the modulefiles, with Debian's Environment Modules (Tcl) and with Lmod: stand-in
# modules named like MIT SuperCloud's (anaconda/2023a, mpi/openmpi-4.1.5, cuda/..., nccl/...)
# point at the Debian toolchain; `make -f Makefile.llsc install` loads them, installs mpiddp and
# its modulefile; then, in a fresh shell, `module load mpi/openmpi-4.1.5 mpiddp` runs
# `mpiddp info` on 2 ranks and builds and runs a project that calls find_package(mpiddp).
# Skips (exit 77, with the reason) where a module system is missing.
# usage: modules.sh SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/lib.sh"
src=$1 build=$2
# Lmod: installed, or unpacked into the build by scripts/lmod.sh (it conflicts with Environment Modules).
lmod_init=/usr/share/lmod/lmod/init/bash
[ -f "$lmod_init" ] || lmod_init=$build/lmod/usr/share/lmod/lmod/init/bash
declare -A init=([tcl]=/usr/share/modules/init/bash [lmod]=$lmod_init)
available=()
for flavour in tcl lmod; do
  if [ -f "${init[$flavour]}" ]; then available+=("$flavour"); else echo "SKIP - $flavour: ${init[$flavour]} is missing (Debian: environment-modules; Lmod: scripts/lmod.sh)"; fi
done
[ ${#available[@]} -gt 0 ] || exit 77
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Stand-ins: Tcl modulefiles (both systems read them) that put the Debian toolchain on the path.
standin() {  # standin NAME body-lines...
  mkdir -p "$tmp/standins/$(dirname "$1")"
  { echo "#%Module1.0"; echo "module-whatis \"stand-in for SuperCloud's $1: Debian's toolchain\""; shift; printf '%s\n' "$@"; } \
    >"$tmp/standins/$1"
}
standin anaconda/2023a "prepend-path PATH /usr/bin"
standin mpi/openmpi-4.1.5 "setenv MPI_HOME /usr/lib/x86_64-linux-gnu/openmpi" "prepend-path PATH /usr/bin"
standin cuda/13.0 "setenv CUDA_HOME /usr/local/cuda" "prepend-path PATH /usr/local/cuda/bin"
standin nccl/2.28-cuda13.0 "setenv NCCL_HOME /usr/local/cuda"
modules="anaconda/2023a mpi/openmpi-4.1.5 cuda/13.0 nccl/2.28-cuda13.0"

for flavour in "${available[@]}"; do
  dir=$tmp/$flavour
  mkdir -p "$dir"
  printf 'source %s\nmodule use %s\n' "${init[$flavour]}" "$tmp/standins" >"$dir/profile"
  # Reuses the suite's configured build (Makefile.llsc configures only a new BUILD directory).
  make_llsc=(make -s -C "$src" -f Makefile.llsc BUILD="$build" PREFIX="$dir/prefix" MODULEFILES="$dir/modulefiles"
             MODULES="$modules" PROFILE="$dir/profile")
  out=$("${make_llsc[@]}" info 2>&1)
  check "$flavour: make info loads the modules and says what it found" \
    bash -c 'grep -q "^mpirun: */usr/bin/mpirun" <<<"$1" && grep -q "^MPI: *mpirun (Open MPI)" <<<"$1" && grep -q "mpi/openmpi-4.1.5" <<<"$1"' _ "$out"
  out=$("${make_llsc[@]}" MODULES="$modules no/such-module" info 2>&1)
  check "$flavour: a module that cannot load is an error" contains "error: module load no/such-module failed" "$out"
  out=$("${make_llsc[@]}" install 2>&1)
  check "$flavour: make install" [ $? -eq 0 ]
  check "$flavour: Tcl modulefile installed" [ -f "$dir/modulefiles/mpiddp/0.1.0" ]
  check "$flavour: Lmod modulefile installed" [ -f "$dir/modulefiles/mpiddp/0.1.0.lua" ]
  check "$flavour: the prefix is substituted (Tcl)" grep -q "set root \"$dir/prefix\"" "$dir/modulefiles/mpiddp/0.1.0"
  check "$flavour: the prefix is substituted (Lmod)" grep -q "local root = \"$dir/prefix\"" "$dir/modulefiles/mpiddp/0.1.0.lua"
  check "$flavour: the MPI module is a prerequisite (Tcl)" grep -q 'split "mpi/openmpi-4.1.5"' "$dir/modulefiles/mpiddp/0.1.0"
  check "$flavour: the MPI module is a prerequisite (Lmod)" grep -q '("mpi/openmpi-4.1.5"):gmatch' "$dir/modulefiles/mpiddp/0.1.0.lua"

  # A fresh login-like shell: nothing but the module system, then `module load`.
  cat >"$dir/job.sh" <<EOF
set -e
source "$dir/profile"
module use "$dir/modulefiles"
module load mpi/openmpi-4.1.5 mpiddp
echo "MPIDDP_ROOT=\$MPIDDP_ROOT"
echo "which=\$(command -v mpiddp)"
module whatis mpiddp 2>&1 | grep -q "MPI-native data-parallel training" && echo "whatis ok"
mpirun -np 2 --oversubscribe mpiddp info | tail -n 1
cmake -S "$src/tests/install" -B "$dir/consumer" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$dir/consumer" >/dev/null
mpirun -np 2 --oversubscribe "$dir/consumer/mpiddp_consumer"
EOF
  out=$(env -i HOME="$HOME" PATH=/usr/bin:/bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout -k 5 600 bash --noprofile --norc "$dir/job.sh" 2>&1)
  rc=$?
  err=$out
  check "$flavour: module load mpiddp in a fresh shell works" [ "$rc" -eq 0 ]
  check "$flavour: MPIDDP_ROOT and PATH point at the install" \
    bash -c 'grep -qx "MPIDDP_ROOT=$2" <<<"$1" && grep -qx "which=$2/bin/mpiddp" <<<"$1"' _ "$out" "$dir/prefix"
  check "$flavour: module whatis" contains "^whatis ok$" "$out"
  check "$flavour: mpiddp info on 2 ranks: OK" contains "^OK$" "$out"
  check "$flavour: find_package(mpiddp) through CMAKE_PREFIX_PATH, built and run on 2 ranks" \
    [ "$(grep -c '^consumer: rank [01] of 2, sanity ok, sum 3$' <<<"$out")" -eq 2 ]
done
finish
