#!/usr/bin/env bash
# One round of bench/lm_bench.sh on one stack (the host or the chroot): mpiddp and Python, each a
# short and a long run; one JSON line per run in OUT/results.jsonl. MPIDDP_BENCH_BEFORE=PATH/mpiddp
# adds that earlier build as the contender mpiddp_before (Debian 12 stack), in the same rounds.
#   usage: bench/lm_round.sh STACK BUILD_DIR ROUND OUT_DIR TOKEN_SHARD
set -euo pipefail
cd "$(dirname "$0")/.."
stack=$1 build=$2 round=$3 out=$4 text=$5
source scripts/env.sh
py=${MPIDDP_BENCH_PYTHON:-/usr/bin/python3}  # the stack's Python (scripts/stacks.sh: on_stack)
shape=(4 4 256 128) batch=4 accum=2
tokens_per_step=$((2 * batch * accum * 128))
contenders="mpiddp python"
[ -n "${MPIDDP_BENCH_BEFORE:-}" ] && [ "$stack" = debian12 ] && contenders+=" mpiddp_before"
for steps in 8 40; do
  for who in $contenders; do
    rss=$(mktemp)
    t0=$(date +%s.%N)
    if [ "$who" != python ]; then
      exe=$build/mpiddp
      [ "$who" = mpiddp_before ] && exe=$MPIDDP_BENCH_BEFORE
      mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core /usr/bin/time -a -o "$rss" -f %M "$exe" train \
        --model gpt --n-layer 4 --n-head 4 --n-embd 256 --block-size 128 --vocab-size 256 \
        --data "$text" --batch-size $batch --grad-accum $accum --max-steps $steps --epochs 1000 \
        --optimizer adamw --lr 1e-3 --betas 0.9,0.95 --weight-decay 0.1 --weight-decay-params matrices \
        --clip-grad-norm 1.0 --threads 1 --log-every 0 >/dev/null
    else
      mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core /usr/bin/time -a -o "$rss" -f %M $py bench/python_gpt_ddp.py \
        "$text" $steps "${shape[@]}" $batch $accum 1 >/dev/null
    fi
    t1=$(date +%s.%N)
    $py -c 'import json, sys
print(json.dumps({"stack": sys.argv[1], "round": int(sys.argv[2]), "who": sys.argv[3], "steps": int(sys.argv[4]),
                  "tokens": int(sys.argv[4]) * int(sys.argv[5]), "seconds": float(sys.argv[7]) - float(sys.argv[6]),
                  "rss_kib": [int(l) for l in open(sys.argv[8]) if l.strip().isdigit()]}))' \
      "$stack" "$round" "$who" $steps $tokens_per_step "$t0" "$t1" "$rss" >>"$out/results.jsonl"
    rm -f "$rss"
  done
done
