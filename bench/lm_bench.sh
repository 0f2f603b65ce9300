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
# Records: per round, each contender's tokens/s from its two lengths (start-up cancels) and the
# peak RSS of a rank in its long run.
/usr/bin/python3 - "$out/results.jsonl" <<'PY' | record_tsv
import json, sys
NAMES = {"mpiddp": "mpiddp, 2 ranks", "python": "Python DDP (nanoGPT's model), 2 ranks",
         "mpiddp_before": "mpiddp before a change, 2 ranks"}
runs = {}
for r in map(json.loads, open(sys.argv[1])):
    runs.setdefault((r["stack"], r["round"], r["who"]), []).append(r)
for (stack, rnd, who), pair in runs.items():
    if len(pair) != 2:
        continue
    short, long = sorted(pair, key=lambda r: r["steps"])
    rate = (long["tokens"] - short["tokens"]) / (long["seconds"] - short["seconds"])
    print(f"{stack}\t{rnd}\t{NAMES[who]}\tthroughput\t{rate}\ttokens/s")
    print(f"{stack}\t{rnd}\t{NAMES[who]}\tpeak RSS of a rank\t{max(long['rss_kib']) / 1024}\tMiB")
PY
save_results
/usr/bin/python3 bench/report.py "$out/records.jsonl"
