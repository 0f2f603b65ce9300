#!/usr/bin/env bash
# ZeRO's memory and speed: the built-in GPT of 6 layers x 6 heads x 384 (block 256, vocabulary 256:
# 10.84 M parameters), AdamW, micro-batch 4, 2 ranks x 1 thread, trained at --zero-stage 0, 1, 2 in
# one call, rounds interleaved. Per stage: each rank's peak RSS (GNU time) in the long run, the
# saving against stage 0 and its share of the ideal saving (stage 1: 8 B/param x (N-1)/N, Adam's
# two moments; stage 2: 12 B/param x (N-1)/N, also the gradient); tokens/s as the wall-clock
# marginal of two run lengths (start-up cancels) and its ratio to stage 0's. Buckets of 2 MiB at
# every stage (MPIDDP_ZERO_BUCKET_MB): stage 2 holds up to two buckets' buffers while they are
# reduced, and the all-gather after the step one bucket's, so a bucket must be small against the
# model (the 25 MiB default is half of this one's 43 MB of gradients).
#   usage: bench/zero_bench.sh [BUILD_DIR] [ROUNDS] [RANKS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init zero 2 "${1:-}" "${2:-}"
ranks=${3:-2}
bash scripts/deps.sh time >&2
bash scripts/build.sh "$build" >&2
text=$(workload_text)
layers=6 heads=6 width=384 block=256 vocab=256 batch=4 bucket_mb=${MPIDDP_ZERO_BUCKET_MB:-2}
: >"$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for stage in 0 1 2; do
    for steps in 3 9; do
      rss=$(mktemp)
      t0=$(date +%s.%N)
      mpirun -np "$ranks" "${MPIRUN_FLAGS[@]}" --bind-to core /usr/bin/time -a -o "$rss" -f %M "$build/mpiddp" train \
        --model gpt --n-layer $layers --n-head $heads --n-embd $width --block-size $block --vocab-size $vocab \
        --data "$text" --batch-size $batch --max-steps $steps --epochs 1000 \
        --optimizer adamw --lr 6e-4 --betas 0.9,0.95 --weight-decay 0.1 --weight-decay-params matrices \
        --clip-grad-norm 1.0 --zero-stage $stage --bucket-cap-mb "$bucket_mb" --first-bucket-cap-mb 1 --threads 1 \
        --log-every 0 >/dev/null
      t1=$(date +%s.%N)
      /usr/bin/python3 -c 'import json, sys
print(json.dumps({"round": int(sys.argv[1]), "stage": int(sys.argv[2]), "steps": int(sys.argv[3]),
                  "tokens": int(sys.argv[3]) * int(sys.argv[4]), "seconds": float(sys.argv[6]) - float(sys.argv[5]),
                  "rss_kib": [int(l) for l in open(sys.argv[7]) if l.strip().isdigit()]}))' \
        "$round" $stage $steps $((ranks * batch * block)) "$t0" "$t1" "$rss" >>"$out/results.jsonl"
      rm -f "$rss"
    done
  done
done
save_results "$out/results.jsonl"
/usr/bin/python3 - "$out/results.jsonl" $layers $width $block $vocab "$ranks" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
L, C, T, V, N = (int(a) for a in sys.argv[2:7])
params = L * (12 * C * C + 13 * C) + V * C + T * C + 2 * C  # nanoGPT's GPT with biases, lm_head tied
ideal = {0: 0, 1: 8 * params * (N - 1) / N, 2: 12 * params * (N - 1) / N}
def per_stage(stage):
    rates, peaks = [], []
    for rnd in sorted({r["round"] for r in rows}):
        runs = sorted((r for r in rows if r["round"] == rnd and r["stage"] == stage), key=lambda r: r["steps"])
        short, long = runs[0], runs[-1]
        rates.append((long["tokens"] - short["tokens"]) / (long["seconds"] - short["seconds"]))
        peaks.append(max(long["rss_kib"]) * 1024)
    return statistics.median(rates), statistics.median(peaks), rates
base_rate, base_peak, _ = per_stage(0)
print(f"GPT {L} layers x {C} wide, block {T}, vocabulary {V}: {params / 1e6:.2f} M parameters; {N} ranks x 1 thread; "
      f"medians over {len({r['round'] for r in rows})} rounds")
print("| stage | peak RSS per rank, MiB | saved vs stage 0, MiB | ideal saving, MiB | share of ideal | tokens/s | vs stage 0 |")
print("|---|---|---|---|---|---|---|")
for stage in (0, 1, 2):
    rate, peak, rates = per_stage(stage)
    saved = base_peak - peak
    share = f"{saved / ideal[stage]:.0%}" if ideal[stage] else "-"
    print(f"| {stage} | {peak / 2**20:.0f} | {saved / 2**20:.0f} | {ideal[stage] / 2**20:.0f} | {share} | "
          f"{rate:.0f} ({', '.join(f'{r:.0f}' for r in rates)}) | {rate / base_rate:.3f} |")
PY
