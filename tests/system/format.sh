#!/usr/bin/env bash
# The C++ of src/, include/ and tests/ is as .clang-format lays it out: fails naming each file that
# differs (`clang-format -i FILE` mends it). The layout is clang-format's: this check runs where the
# version the tree was formatted with (Debian 12's clang-format 14) is installed, and says so elsewhere.
# usage: format.sh SOURCE_DIR
set -euo pipefail
cd "$1"
command -v clang-format >/dev/null || { echo "format: error: clang-format is not installed (Debian: clang-format)" >&2; exit 1; }
version=$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
[ "$version" = 14 ] || { echo "format: error: clang-format $version, not 14 (the tree's layout is 14's)" >&2; exit 1; }
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.hpp' 'include/*.hpp' 'tests/*.cpp' 'tests/*.hpp' 2>/dev/null ||
                     find src include tests -name '*.cpp' -o -name '*.hpp')
[ ${#files[@]} -gt 0 ] || { echo "format: error: no C++ files found under $1" >&2; exit 1; }
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'format: not as .clang-format lays it out: %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format: ${#files[@]} files as .clang-format lays them out"
