#!/usr/bin/env bash
# The largest GPT that trains under one memory limit, per ZeRO stage: RANKS x 1 thread in a memory
# cgroup (v1 or v2; the job's whole memory, as Slurm's ConstrainRAMSpace limits a job on a node) of
# LIMIT_GIB, nanoGPT's GPT of LAYERS x 1152 wide (block 64, vocabulary 256), AdamW, 2 steps of
# micro-batch 1, at stage 0, 2, 3 and 3 with activation checkpointing (MPIDDP_FIT_STAGES, words of
# 0-3 with "ac" for checkpointing, e.g. "2ac"; MPIDDP_FIT_RANKS, default "2 4"), for each size: whether
# it trained (else the kernel's OOM killer ended a rank) and the cgroup's peak memory. Block 64 leaves
# almost no activations, so the parameters' state decides; MPIDDP_FIT_SHAPE="WIDTH HEADS BLOCK"
# changes the shape, e.g. "768 12 1024" for GPT-2's width and context, where activations decide too.
# Needs root (it makes the cgroup).
# Records (per size: trained 1/0 and the peak) in $OUT_DIR/records.jsonl, tabled by bench/report.py.
#   usage: bench/zero_fit.sh [BUILD_DIR] [LIMIT_GIB] [LAYERS...]   (logs in $OUT_DIR, default BUILD_DIR/bench-zero-fit)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init zero-fit 1 "${1:-}"
limit_gib=${2:-8}
shift $(($# > 2 ? 2 : $#))
layers=("$@")
[ ${#layers[@]} -gt 0 ] || layers=(8 12 16 20 24)
bash scripts/build.sh "$build" >&2
text=$(workload_text)
read -r width heads block <<<"${MPIDDP_FIT_SHAPE:-1152 16 64}"
vocab=256

# A fresh cgroup per run (its peak counter starts at zero): v2 where mounted as such, else v1.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  root=/sys/fs/cgroup limit_file=memory.max peak_file=memory.peak
else
  root=/sys/fs/cgroup/memory limit_file=memory.limit_in_bytes peak_file=memory.max_usage_in_bytes
fi
run_limited() {  # run_limited LOG CMD...: prints "<exit status> <peak bytes>"
  local log=$1 cg=$root/mpiddp-zero-fit-$$-$RANDOM rc=0
  shift
  mkdir "$cg"
  echo $((limit_gib << 30)) >"$cg/$limit_file"
  [ -f "$cg/memory.memsw.limit_in_bytes" ] && echo $((limit_gib << 30)) >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null
  bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "$@" >"$log" 2>&1 || rc=$?
  echo "$rc $(cat "$cg/$peak_file" 2>/dev/null || echo 0)"
  # After an OOM kill the job's other processes may still be on their way out.
  for _ in $(seq 1 30); do
    xargs -r kill -9 <"$cg/cgroup.procs" 2>/dev/null || true
    rmdir "$cg" 2>/dev/null && return 0
    sleep 1
  done
  echo "zero_fit.sh: error: cannot remove the cgroup $cg" >&2
  return 1
}

echo "limit ${limit_gib} GiB for the job; GPT L x ${width} wide, ${heads} heads, block ${block}, vocabulary ${vocab}" >&2
for ranks in ${MPIDDP_FIT_RANKS:-2 4}; do
  for l in "${layers[@]}"; do
    params=$((l * (12 * width * width + 13 * width) + vocab * width + block * width + 2 * width))
    size="$l layers ($(awk -v p=$params 'BEGIN { printf "%.0f M", p / 1e6 }') parameters)"
    for stage in ${MPIDDP_FIT_STAGES:-0 2 3 3ac}; do
      flags=(--zero-stage "${stage%ac}")
      name="stage ${stage%ac}"
      [ "$stage" = "${stage%ac}" ] || { flags+=(--activation-checkpointing); name+=" + checkpointing"; }
      binding=core
      [ "$ranks" -le "$(nproc)" ] || binding=none  # more ranks than cores: no core of its own
      read -r rc peak < <(run_limited "$out/fit-n$ranks-L$l-s$stage.log" mpirun -np "$ranks" "${MPIRUN_FLAGS[@]}" \
        --bind-to $binding "$build/mpiddp" train --model gpt --n-layer "$l" --n-head $heads --n-embd $width \
        --block-size $block --vocab-size $vocab --data "$text" --batch-size 1 --max-steps 2 --optimizer adamw \
        --lr 6e-4 --weight-decay 0.1 --weight-decay-params matrices "${flags[@]}" --threads 1 --log-every 0)
      trained=$([ "$rc" -eq 0 ] && echo 1 || echo 0)
      echo "$ranks ranks, $size, $name: exit $rc, peak $peak bytes" >&2
      group="limit ${limit_gib} GiB, $ranks ranks"
      [ "$width $heads $block" = "1152 16 64" ] || group+=", ${width} wide, block $block"
      record "$group" 1 "$name" "$size: trained (1) or out of memory (0)" "$trained" ""
      record "$group" 1 "$name" "$size: peak memory of the job" \
        "$(awk -v b="$peak" 'BEGIN { print b / 2^30 }')" GiB
    done
  done
done
save_results
python3 bench/report.py "$out/records.jsonl"
