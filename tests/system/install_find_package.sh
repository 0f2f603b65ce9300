#!/usr/bin/env bash
# Installs this build into a temporary prefix, then builds and runs a separate project that finds
# it with find_package(mpiddp), and runs the installed `mpiddp info`.
# usage: install_find_package.sh BUILD_DIR CONSUMER_SOURCE_DIR
source "$(dirname "$0")/lib.sh"
build=$1 consumer=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check "cmake --install" cmake --install "$build" --prefix "$tmp/prefix"
check "package config installed" test -f "$tmp/prefix/lib/cmake/mpiddp/mpiddpConfig.cmake"
check "consumer configures with find_package(mpiddp)" \
  cmake -S "$consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release
check "consumer builds" cmake --build "$tmp/consumer"

run_np 2 "$tmp/consumer/mpiddp_consumer"
check "consumer runs on 2 ranks" [ "$rc" -eq 0 ]
check "consumer: both ranks report" [ "$(grep -c '^consumer: rank [01] of 2, sanity ok, sum 3$' <<<"$out")" -eq 2 ]

run_np 2 "$tmp/prefix/bin/mpiddp" info
check "installed mpiddp info on 2 ranks: exit 0" [ "$rc" -eq 0 ]
check "installed mpiddp info on 2 ranks: OK" [ "$(last_line "$out")" = OK ]
finish
