#!/usr/bin/env bash
# The rooms of src/ (its folders) include each other without a cycle (scripts/rooms.py): fails naming
# the cycle and the includes that close it (internal headers and the public ones a room implements);
# a cycle added in a copy is caught, and a public header no room is known to implement.
# usage: rooms.sh SOURCE_DIR
source "$(dirname "$0")/lib.sh"
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rooms() { "$TEST_PYTHON" "$src/scripts/rooms.py" "$@" >"$tmp/out" 2>&1; }
says() { grep -q -- "$1" "$tmp/out"; }

rooms --root "$src" --check
rc=$?
err=$(cat "$tmp/out")  # shown by check on a failure: the cycles and their includes
check "the rooms include each other without a cycle" [ $rc -eq 0 ]
err=
rooms --root "$src" --print
rc=$?
check "the graph prints" [ $rc -eq 0 ]
check "with comm above runtime" says '^comm -> runtime '
check "and no room above app" lacks '-> app ' "$(cat "$tmp/out")"

# A copy of src/ whose runtime includes a header of comm (which includes runtime).
cp -r "$src/src" "$tmp/src"
printf '#include "comm/work.hpp"\n' >>"$tmp/src/runtime/wait.hpp"
rooms --root "$tmp" --check
rc=$?
check "a cycle fails the check" [ $rc -eq 1 ]
check "it names the cycle" says '^rooms: cycle: comm -> runtime -> comm '
check "and the include that closes it" says '^  runtime -> comm: src/runtime/wait.hpp: #include "comm/work.hpp"'

# The same through a public header comm implements (process_group.hpp).
cp "$src/src/runtime/wait.hpp" "$tmp/src/runtime/wait.hpp"
printf '#include <mpiddp/process_group.hpp>\n' >>"$tmp/src/runtime/wait.hpp"
rooms --root "$tmp" --check
rc=$?
check "a cycle through a public header fails the check" [ $rc -eq 1 ]
check "naming that include" says '^  runtime -> comm: src/runtime/wait.hpp: #include <mpiddp/process_group.hpp>'

# A header of plain data carries the rooms of what it includes: trainer_options.hpp made to include
# the Trainer's header closes log -> train -> log.
cp "$src/src/runtime/wait.hpp" "$tmp/src/runtime/wait.hpp"
cp -r "$src/include" "$tmp/include"
printf '#include <mpiddp/trainer.hpp>\n' >>"$tmp/include/mpiddp/trainer_options.hpp"
rooms --root "$tmp" --check
rc=$?
check "a cycle through a header of plain data fails the check" [ $rc -eq 1 ]
check "naming the include of it" says '^  log -> train: src/log/progress_log.hpp: #include <mpiddp/trainer_options.hpp>'
rm -rf "$tmp/include"

# A public header no room is known to implement.
cp "$src/src/runtime/wait.hpp" "$tmp/src/runtime/wait.hpp"
mkdir -p "$tmp/include/mpiddp"
: >"$tmp/include/mpiddp/new_part.hpp"
rooms --root "$tmp" --check
rc=$?
check "an unknown public header fails the check" [ $rc -eq 1 ]
check "naming it" says '^rooms: include/mpiddp/new_part.hpp implemented by no room known'
finish
