#!/usr/bin/env bash
# The figure tables of README.md, docs/performance.md and docs/gpu.md are what the records in
# bench/results/ give (scripts/figures.py generates them): fails, naming the page and the block,
# when one differs; and a figure changed by hand in a copy is caught, then rewritten from the records.
# usage: figures.sh SOURCE_DIR
source "$(dirname "$0")/lib.sh"
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

figures() { "$TEST_PYTHON" "$1/scripts/figures.py" "${@:2}" >"$tmp/out" 2>&1; }
says() { grep -q -- "$1" "$tmp/out"; }

figures "$src" --check
rc=$?
err=$(cat "$tmp/out")  # shown by check on a failure: the pages and blocks that differ
check "the pages agree with their records" [ $rc -eq 0 ]
err=

# A copy of what the script reads, with one figure of docs/gpu.md's table changed.
mkdir -p "$tmp/copy/scripts" "$tmp/copy/bench" "$tmp/copy/docs"
cp "$src/scripts/figures.py" "$tmp/copy/scripts/"
cp "$src/bench/report.py" "$tmp/copy/bench/"
cp -r "$src/bench/results" "$tmp/copy/bench/"
cp "$src/README.md" "$tmp/copy/"
cp "$src"/docs/*.md "$tmp/copy/docs/"  # every page figures.py keeps
"$TEST_PYTHON" - "$tmp/copy/docs/gpu.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"<!-- figures gpu-figures -->\n.*?<!-- end -->", text, re.S).group(0)
changed = re.sub(r"(\d+)\.(\d\d)×", lambda m: f"{m.group(1)}.{(int(m.group(2)) + 1) % 100:02d}×", block, count=1)
assert changed != block
open(sys.argv[1], "w").write(text.replace(block, changed))
PY
figures "$tmp/copy" --check
rc=$?
check "a changed figure fails the check" [ $rc -eq 1 ]
check "it names the page and the block" says 'docs/gpu.md: block `gpu-figures` differs from its records'
check "only that block" [ "$(grep -c 'differs' "$tmp/out")" -eq 1 ]
figures "$tmp/copy"
figures "$tmp/copy" --check
rc=$?
check "rewriting the pages from the records restores it" [ $rc -eq 0 ]
check "to the page as it is in the source tree" cmp -s "$src/docs/gpu.md" "$tmp/copy/docs/gpu.md"

# A block a page must hold, missing.
"$TEST_PYTHON" -c 'import sys; p = sys.argv[1]; t = open(p).read(); open(p, "w").write(t.replace("<!-- figures soak -->", "<!-- soak -->"))' \
  "$tmp/copy/docs/performance.md"
figures "$tmp/copy" --check
rc=$?
check "a missing block fails" [ $rc -eq 1 ]
check "it names the page and the block" says 'docs/performance.md: 0 blocks `<!-- figures soak -->`, want 1'
finish
