#!/usr/bin/env bash
# End-to-end: `mpiddp bench` at 1..4 ranks on every CPU backend built, all collectives with the
# correctness check on, the JSON/CSV outputs, and bad input.
# usage: bench_cli.sh path/to/mpiddp
source "$(dirname "$0")/lib.sh"
mpiddp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
backends=${MPIDDP_BACKENDS:-mpi}

for backend in $backends; do
  [ "$backend" = nccl ] && continue  # needs a GPU per rank: tests/gpu
  for n in 1 2 3 4; do
    run_np "$n" "$mpiddp" bench --backend "$backend" --collective all -b 4 -e 64K -f 16 -w 1 -n 2 -c 1 \
      --json "$tmp/$backend$n.json" --csv "$tmp/$backend$n.csv"
    check "$backend np$n: exit 0" [ "$rc" -eq 0 ]
    check "$backend np$n: no wrong element" contains "^# Out of bounds values : 0 OK$" "$out"
    check "$backend np$n: avg bus bandwidth footer" contains "^# Avg bus bandwidth    : " "$out"
    check "$backend np$n: JSON complete and consistent with the formulas" python3 - "$tmp/$backend$n.json" "$n" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); n = int(sys.argv[2])
assert d["result"] == "OK" and d["world_size"] == n and d["wrong"] == 0
seen = {r["collective"] for r in d["results"]}
assert seen == {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"}, seen
factor = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
          "alltoall": (n - 1) / n, "broadcast": 1.0}
for r in d["results"]:
    for p in ("out_of_place", "in_place"):
        m = r[p]
        assert m["wrong"] == 0
        assert m["time_us_p50"] <= m["time_us_max"] + 1e-9 and m["time_us_min"] <= m["time_us_p95"] + 1e-9
        assert abs(m["algbw_gbps"] - r["size_bytes"] / (m["time_us"] * 1e-6) / 1e9) <= 1e-6 * max(1, m["algbw_gbps"])
        assert abs(m["busbw_gbps"] - m["algbw_gbps"] * factor[r["collective"]]) <= 1e-9 + 1e-9 * m["busbw_gbps"]
    if r["collective"] in ("allgather", "reduce_scatter", "alltoall"):
        assert r["count"] % n == 0
PY
    check "$backend np$n: CSV has two rows per size" python3 -c '
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1]))); d = json.load(open(sys.argv[2]))
assert len(rows) == 2 * len(d["results"]) and all(r["wrong"] == "0" for r in rows)' "$tmp/$backend$n.csv" "$tmp/$backend$n.json"
  done
done

run_np 3 "$mpiddp" bench -b 1K -e 1K -d bfloat16 -o avg -c 1
check "bfloat16 avg on mpi: exit 0" [ "$rc" -eq 0 ]
check "bfloat16 avg on mpi: checked" contains "bfloat16     avg" "$out"
run_np 2 "$mpiddp" bench -b 64 -e 64 -d int64 -o max --collective reduce_scatter
check "int64 max reduce_scatter: exit 0" [ "$rc" -eq 0 ]

for bad in "-b 1X" "-b 8M -e 1M" "-f 1" "-n 0" "-c 2" "--dtype complex64" "--op prod" "--collective gossip" \
           "--backend carrier-pigeon" "--root 9" "--iters many" "--frobnicate" "--device tpu"; do
  # shellcheck disable=SC2086
  run_np 2 "$mpiddp" bench $bad
  check "bad input '$bad': non-zero exit, no hang" failed_cleanly
  check "bad input '$bad': one line" one_line "$err"
done
if [[ " $backends " != *" nccl "* ]] || ! command -v nvidia-smi >/dev/null; then
  run_np 2 "$mpiddp" bench --backend nccl
  check "nccl without GPUs: non-zero exit" failed_cleanly
  check "nccl without GPUs: one line saying so" one_line "$err"
fi
if ! command -v nvidia-smi >/dev/null; then
  run_np 2 "$mpiddp" bench --device cuda
  check "--device cuda without GPUs: non-zero exit" failed_cleanly
  check "--device cuda without GPUs: one line saying so" one_line "$err"
  check "--device cuda without GPUs: says why" contains "device cuda: this rank has no GPU" "$err"
fi
finish
