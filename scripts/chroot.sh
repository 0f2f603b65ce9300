#!/usr/bin/env bash
# Runs a command inside a Debian chroot of a newer suite (default: sid, libtorch 2.14), with this
# repository mounted at the same path, so mpiddp is built and tested against a newer libtorch,
# GCC, Open MPI and HDF5 with Debian's own packages.
#
#   usage: scripts/chroot.sh [--suite SUITE] [--dir DIR] [--] COMMAND...
#          scripts/chroot.sh --suite trixie -- bash scripts/build.sh build-trixie
#
# The chroot is made once by debootstrap from the mirror this machine's apt uses (~3 GB, ~10 min)
# and reused; scripts/deps.sh, run inside it, installs what it lacks (only that). proc, sys, dev, a tmpfs on
# dev/shm and the repository are mounted for the command and unmounted on every exit (trap), and a
# lock keeps two runs from mounting the same chroot at once. Needs root.
# Environment: MPIDDP_CHROOT_ROOT (where chroots live, default /var/cache/mpiddp).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
suite=sid
dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "chroot.sh: error: unknown option '$1'" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "chroot.sh: error: no command given (usage: scripts/chroot.sh [--suite S] [--dir D] -- CMD...)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "chroot.sh: error: needs root (debootstrap, mount, chroot)" >&2; exit 1; }
dir=${dir:-${MPIDDP_CHROOT_ROOT:-/var/cache/mpiddp}/chroot-$suite}

# The mirror this machine's apt already uses (deb822 or one-line format).
mirror() {
  local m
  m=$(grep -hs -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
  [ -n "$m" ] || m=$(grep -hs -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
                       awk '{print $2}' | grep -v security | head -1)
  [ -n "$m" ] || { echo "chroot.sh: error: no Debian mirror found in /etc/apt" >&2; exit 1; }
  echo "$m"
}

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -l "${mounted[$i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mount_at() {  # mount_at TARGET mount-arguments...
  local target=$1; shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounted+=("$target")
}
mount_base() {
  mount_at "$dir/proc" -t proc proc
  mount_at "$dir/sys" --rbind /sys
  mount --make-rslave "$dir/sys"
  mount_at "$dir/dev" --rbind /dev
  mount --make-rslave "$dir/dev"
  mount_at "$dir/dev/shm" -t tmpfs -o size=4g tmpfs
}
in_chroot() {
  chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CI="${CI:-}" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@"
}

if [ ! -x "$dir/usr/bin/apt-get" ]; then
  command -v debootstrap >/dev/null || bash "$repo/scripts/deps.sh" debootstrap
  rm -rf "$dir"
  echo "chroot.sh: making a Debian $suite chroot in $dir (debootstrap, a few minutes)"
  debootstrap --variant=minbase --no-check-gpg "$suite" "$dir" "$(mirror)" > "$dir.debootstrap.log" 2>&1 ||
    { tail -20 "$dir.debootstrap.log" >&2; echo "chroot.sh: error: debootstrap of $suite failed (log: $dir.debootstrap.log)" >&2; exit 1; }
  # A suite past its Release file's Valid-Until date (sid, here) is still what the mirror serves.
  echo 'Acquire::Check-Valid-Until "false";' > "$dir/etc/apt/apt.conf.d/99mpiddp-valid-until"
  echo 'APT::Install-Recommends "false";' > "$dir/etc/apt/apt.conf.d/99mpiddp-no-recommends"
fi
mount_base
mount_at "$dir$repo" --bind "$repo"
# CUDA and NCCL are not Debian packages: the host's, where present, so the nccl backend builds there too.
if [ -d /usr/local/cuda ]; then
  mount_at "$dir/usr/local/cuda" --bind "$(readlink -f /usr/local/cuda)"
  mount -o remount,bind,ro "$dir/usr/local/cuda" 2>/dev/null || true
fi
# The packages mpiddp needs, as on the host, plus the Python peer of the benchmarks.
cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
in_chroot bash "$repo/scripts/deps.sh" python3-torch python3-h5py python3-protobuf > "$dir.apt.log" 2>&1 ||
  { tail -30 "$dir.apt.log" >&2; echo "chroot.sh: error: installing mpiddp's packages in the $suite chroot failed (log: $dir.apt.log)" >&2; exit 1; }
set +e
in_chroot /bin/bash -c 'cd "$0" && exec "$@"' "$repo" "$@"
rc=$?
set -e
exit $rc
