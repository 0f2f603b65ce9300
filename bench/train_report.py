"""Tables of bench/train_bench.sh from its results.jsonl: per stack, workload and contender, the
median over rounds (and the range) of wall-clock throughput (long run minus short run) and of the
time to first step, with mpiddp's ratio to each contender.

usage: python3 bench/train_report.py results.jsonl
"""
import json
import statistics as st
import sys

NAMES = {"python": "Python DDP (gloo), 2 ranks", "handwritten": "hand-written libtorch + MPI, 2 ranks",
         "mpiddp": "mpiddp, 2 ranks", "single": "1 process, 2 threads",
         "python_fused": "Python DDP (gloo), Adam(fused=True), 2 ranks",
         "mpiddp_before": "mpiddp before a change ($MPIDDP_BENCH_BEFORE), 2 ranks"}


def per_round(rows):
    """{(stack, workload, who): [(throughput, first_step_s), ...]} from each round's two lengths."""
    runs = {}
    for r in rows:
        runs.setdefault((r["stack"], r["workload"], r["who"], r["round"]), []).append(r)
    out = {}
    for (stack, workload, who, _), pair in sorted(runs.items()):
        if len(pair) != 2:
            continue
        short, long = sorted(pair, key=lambda r: r["epochs"])
        unit = "steps" if workload == "toy" else "samples"
        rate = (long[unit] - short[unit]) / (long["wall_s"] - short["wall_s"])
        out.setdefault((stack, workload, who), []).append((rate, short["first_step_s"], long["torch"]))
    return out


def main():
    rows = [json.loads(line) for line in open(sys.argv[1])]
    data = per_round(rows)
    stacks = sorted({k[0] for k in data}, key=lambda s: (s != "debian12", s))
    for stack in stacks:
        torch_version = next(v[0][2] for k, v in data.items() if k[0] == stack)
        print(f"\n### {stack} (PyTorch / libtorch {torch_version})\n")
        print("| workload | contender | throughput (median, range) | time to first step, s | "
              "mpiddp / this, throughput | this / mpiddp, first step |")
        print("|---|---|---|---|---|---|")
        for workload in ("toy", "cnn"):
            unit = "steps/s" if workload == "toy" else "samples/s"
            mine = data.get((stack, workload, "mpiddp"))
            if not mine:
                continue
            m_rate = st.median(x[0] for x in mine)
            m_first = st.median(x[1] for x in mine)
            for who in NAMES:
                got = data.get((stack, workload, who))
                if not got:
                    continue
                rates = [x[0] for x in got]
                first = st.median(x[1] for x in got)
                print(f"| {workload} | {NAMES[who]} | {st.median(rates):,.0f} {unit} ({min(rates):,.0f}-{max(rates):,.0f}) "
                      f"| {first:.2f} | {m_rate / st.median(rates):.2f}x | {first / m_first:.2f}x |")
    print("\nPer-round ratios mpiddp / Python DDP (same round, same stack), sorted:")
    for stack in stacks:
        for workload in ("toy", "cnn"):
            mine, theirs = data.get((stack, workload, "mpiddp"), []), data.get((stack, workload, "python"), [])
            ratios = sorted(m[0] / t[0] for m, t in zip(mine, theirs))
            if ratios:
                print(f"- {stack} {workload}: " + ", ".join(f"{x:.2f}" for x in ratios))
            before = data.get((stack, workload, "mpiddp_before"), [])
            if before:
                ratios = sorted(b[0] / t[0] for b, t in zip(before, theirs))
                print(f"- {stack} {workload}, mpiddp before the change: " + ", ".join(f"{x:.2f}" for x in ratios))
    n = len({r["round"] for r in rows})
    print(f"\nMedians over {n} interleaved round(s); throughput = (long run - short run) work / wall time. "
          "Targets on each stack: CNN >= 1.05x Python DDP, toy >= 30x Python DDP, time to first step "
          "below Python's.")


if __name__ == "__main__":
    main()
