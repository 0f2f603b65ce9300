#!/usr/bin/env bash
# Unpacks Debian's Lmod into DIR without installing it, for the modules tests: Debian's lmod and
# environment-modules conflict (both provide `module`), and the tests exercise both. Lmod's
# dependencies are ordinary packages (scripts/test.sh installs them); its own package is fetched
# with `apt-get download`, unpacked with `dpkg -x`, and its absolute paths pointed into DIR.
# Idempotent. Afterwards: source DIR/usr/share/lmod/lmod/init/bash.  usage: scripts/lmod.sh DIR
set -euo pipefail
dir=$(mkdir -p "$1" && cd "$1" && pwd)
init=$dir/usr/share/lmod/lmod/init/bash
[ -f "$init" ] && { echo "lmod: $init present"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && { apt-get download lmod >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get download lmod >/dev/null; }; })
dpkg -x "$work"/lmod_*.deb "$dir"
grep -rlI -e /usr/share/lmod -e /usr/lib/lmod "$dir" |
  xargs sed -i "s#/usr/share/lmod#$dir/usr/share/lmod#g; s#/usr/lib/lmod#$dir/usr/lib/lmod#g"
echo "lmod: unpacked into $dir"
