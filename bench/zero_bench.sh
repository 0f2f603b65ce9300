#!/usr/bin/env bash
# ZeRO's memory and speed in the run a user makes: the built-in GPT of LAYERS (6) layers x 6 heads x
# 384 (block BLOCK (256), vocabulary 256: 10.84 M parameters at 6 layers and block 256), AdamW,
# micro-batch BATCH (4), RANKS (2) x 1 thread, default options (the bucket cap by the reduction's
# rule; MPIDDP_ZERO_BUCKET_MB sets one), a snapshot every 3 steps (MPIDDP_ZERO_SNAPSHOTS=0: none),
# rounds interleaved. Contenders:
# --zero-stage 0, 1, 2, 3; stage 3 without prefetch (--zero-no-prefetch); stage 3 with activation
# checkpointing (its memory at long contexts: bench/checkpoint_bench.sh).
# Per contender: each rank's peak RSS (GNU time) in the long run and its share of the ideal saving
# (stage 1: 8 B/param x (N-1)/N, Adam's two moments; stage 2: 12, also the gradient; stage 3: 16,
# also the parameters); tokens/s as the wall-clock marginal of two run lengths (start-up cancels).
# Records (bench/lib.sh); the table by bench/report.py, against stage 0.
#   usage: bench/zero_bench.sh [BUILD_DIR] [ROUNDS] [RANKS] [LAYERS] [BLOCK] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init zero 2 "${1:-}" "${2:-}"
ranks=${3:-2}
layers=${4:-6}
bash scripts/deps.sh time >&2
bash scripts/build.sh "$build" >&2
text=$(workload_text)
heads=6 width=384 vocab=256
block=${5:-256}
batch=${6:-4}
buckets=()
[ -n "${MPIDDP_ZERO_BUCKET_MB:-}" ] && buckets=(--bucket-cap-mb "$MPIDDP_ZERO_BUCKET_MB")
work=$(mktemp -d -p "$build")
trap 'rm -rf "$work"' EXIT
snapshots=()
[ "${MPIDDP_ZERO_SNAPSHOTS:-1}" = 0 ] || snapshots=(--snapshot-dir "$work/snaps" --save-every-steps 3)
# contender|flags
contenders=("stage 0|--zero-stage 0" "stage 1|--zero-stage 1" "stage 2|--zero-stage 2" "stage 3|--zero-stage 3"
            "stage 3, no prefetch|--zero-stage 3 --zero-no-prefetch"
            "stage 3 + checkpointing|--zero-stage 3 --activation-checkpointing")
: >"$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for c in "${contenders[@]}"; do
    IFS='|' read -r who flags <<<"$c"
    for steps in 3 9; do
      rss=$(mktemp -p "$work")
      rm -rf "$work/snaps"
      t0=$(date +%s.%N)
      # shellcheck disable=SC2086  # flags: several words
      mpirun -np "$ranks" "${MPIRUN_FLAGS[@]}" --bind-to core /usr/bin/time -a -o "$rss" -f %M "$build/mpiddp" train \
        --model gpt --n-layer $layers --n-head $heads --n-embd $width --block-size $block --vocab-size $vocab \
        --data "$text" --batch-size $batch --max-steps $steps --epochs 1000 \
        --optimizer adamw --lr 6e-4 --betas 0.9,0.95 --weight-decay 0.1 --weight-decay-params matrices \
        --clip-grad-norm 1.0 $flags "${buckets[@]}" "${snapshots[@]}" --threads 1 \
        --log-every 0 >/dev/null
      t1=$(date +%s.%N)
      /usr/bin/python3 -c 'import json, sys
print(json.dumps({"round": int(sys.argv[1]), "contender": sys.argv[2], "steps": int(sys.argv[3]),
                  "tokens": int(sys.argv[3]) * int(sys.argv[4]), "seconds": float(sys.argv[6]) - float(sys.argv[5]),
                  "rss_kib": [int(l) for l in open(sys.argv[7]) if l.strip().isdigit()]}))' \
        "$round" "$who" $steps $((ranks * batch * block)) "$t0" "$t1" "$rss" >>"$out/results.jsonl"
      rm -f "$rss"
    done
  done
done
/usr/bin/python3 - "$out/results.jsonl" $layers $width $block $vocab "$ranks" <<'PY' | record_tsv
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
L, C, T, V, N = (int(a) for a in sys.argv[2:7])
params = L * (12 * C * C + 13 * C) + V * C + T * C + 2 * C  # nanoGPT's GPT with biases, lm_head tied
ideal = {1: 8 * params * (N - 1) / N, 2: 12 * params * (N - 1) / N, 3: 16 * params * (N - 1) / N}
for rnd in sorted({r["round"] for r in rows}):
    peak = {}
    for who in dict.fromkeys(r["contender"] for r in rows):
        short, long = sorted((r for r in rows if r["round"] == rnd and r["contender"] == who), key=lambda r: r["steps"])
        peak[who] = max(long["rss_kib"]) * 1024
        rate = (long["tokens"] - short["tokens"]) / (long["seconds"] - short["seconds"])
        print(f"debian12\t{rnd}\t{who}\tthroughput\t{rate}\ttokens/s")
        print(f"debian12\t{rnd}\t{who}\tpeak RSS per rank\t{peak[who] / 2**20}\tMiB")
        if who != "stage 0":
            stage = int(who.split()[1].rstrip(","))
            print(f"debian12\t{rnd}\t{who}\tshare of ideal saving\t{100 * (peak['stage 0'] - peak[who]) / ideal[stage]}\t%")
PY
save_results
save_results "$out/results.jsonl"
python3 bench/report.py --bench zero --ref "stage 0" "$out/records.jsonl"
