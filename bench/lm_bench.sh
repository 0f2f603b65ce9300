#!/usr/bin/env bash
# Language-model throughput and memory, side by side in one call: mpiddp's built-in GPT against
# nanoGPT's GPT under PyTorch DDP (gloo, started by mpirun; bench/python_gpt_ddp.py), on the stacks
# of bench/train_bench.sh (debian12: libtorch/python3-torch 1.13; sid: 2.14 in the chroot; pip:
# PyTorch's torch 2.11 wheel in a venv, for mpiddp and Python alike), 2 ranks
# x 1 thread, rounds interleaved. The shape is the issue's: 4 layers x 4 heads x 256 wide, block
# 128, micro-batch 4, accumulation 2, AdamW (0.9, 0.95, decay 0.1 on matrices), clip 1.0, on a byte
# vocabulary (llm.c shards of a text Debian ships). tokens/s is the wall-clock marginal of two run
# lengths, (tokens of the long - of the short) / (seconds of the long - of the short), so start-up
# cancels; peak RSS is each rank's maximum resident set (GNU time) in the long run.
#   usage: bench/lm_bench.sh [BUILD_DIR] [ROUNDS]    (MPIDDP_BENCH_STACKS=debian12 for one stack)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init lm 3 "$@"
bash scripts/deps.sh python3-torch time >&2
# shellcheck disable=SC2086  # the list of stacks
build_stacks $stacks
text=$(workload_text)
: >"$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for stack in $stacks; do
    on_stack "$stack" bash bench/lm_round.sh "$stack" "$(stack_dir "$stack" "$build")" "$round" "$out" "$text"
  done
done
save_results "$out/results.jsonl"
/usr/bin/python3 - "$out/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| stack | round | mpiddp tokens/s | Python DDP tokens/s | ratio | peak RSS per rank, MiB (mpiddp / Python) |")
print("|---|---|---|---|---|---|")
ratios = {}
for stack in sorted({r["stack"] for r in rows}):
    for rnd in sorted({r["round"] for r in rows if r["stack"] == stack}):
        rate, rss = {}, {}
        for who in ("mpiddp", "python"):
            runs = sorted((r for r in rows if r["stack"] == stack and r["round"] == rnd and r["who"] == who),
                          key=lambda r: r["steps"])
            short, long = runs[0], runs[-1]
            rate[who] = (long["tokens"] - short["tokens"]) / (long["seconds"] - short["seconds"])
            rss[who] = max(long["rss_kib"]) / 1024
        ratios.setdefault(stack, []).append(rate["mpiddp"] / rate["python"])
        print(f"| {stack} | {rnd} | {rate['mpiddp']:.0f} | {rate['python']:.0f} | {rate['mpiddp'] / rate['python']:.2f} "
              f"| {rss['mpiddp']:.0f} / {rss['python']:.0f} |")
for stack, r in ratios.items():
    print(f"{stack}: median mpiddp / Python tokens/s {statistics.median(r):.2f} over {len(r)} round(s)")
# MPIDDP_BENCH_BEFORE: this build against the earlier one, round by round (same rounds, same noise).
def rate(stack, rnd, who):
    runs = sorted((r for r in rows if r["stack"] == stack and r["round"] == rnd and r["who"] == who), key=lambda r: r["steps"])
    return (runs[-1]["tokens"] - runs[0]["tokens"]) / (runs[-1]["seconds"] - runs[0]["seconds"]) if len(runs) > 1 else None
after_before = [rate(r["stack"], r["round"], "mpiddp") / rate(r["stack"], r["round"], "mpiddp_before")
                for r in rows if r["who"] == "mpiddp_before" and r["steps"] == max(x["steps"] for x in rows)]
if after_before:
    print("mpiddp after / before tokens/s, per round: " + ", ".join(f"{x:.3f}" for x in after_before) +
          f"; median {statistics.median(after_before):.3f}")
PY
