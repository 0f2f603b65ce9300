"""Tables of benchmark records (the format of bench/lib.sh: one JSON object a line with bench,
commit, date, machine, stack, round, contender, metric, value, unit).

For each bench, stack and metric: every contender's median over rounds (and the range), and its
ratio to each reference contender, taken round by round (the same round saw the same machine noise)
and summarised by their median (with the quartiles from 8 ratios on, else every ratio, sorted).

usage: python3 bench/report.py [--bench NAME] [--ref CONTENDER]... RECORDS.jsonl...
  --ref     the contenders to divide by (default: the bench's own, below, else its first contender)
  --bench   only that bench's records
"""
import argparse
import json
import statistics as st
from collections import OrderedDict

# What each bench compares against when no --ref is given.
DEFAULT_REFS = {
    "stall": ["monitor off (MPIDDP_STALL_WARNING=off)"],
    "floor": ["mpiddp train, 2 ranks", "libtorch alone, 1 process (bench/step_floor.cpp)"],
    "ddp": ["without communication (no_sync)"],
    "train": ["Python DDP (gloo), 2 ranks"],
    "lm": ["Python DDP (nanoGPT's model), 2 ranks"],
    "resnet": ["Python DDP (gloo), eager torchvision model"],
    "options": ["prefetch=0", "fp32"],
    "zero-fit": ["stage 0"],
}


def fmt(x):
    if x is None:
        return "n/a"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def summary(ratios):
    ratios = sorted(ratios)
    if not ratios:
        return "-"
    if len(ratios) >= 8:
        q = st.quantiles(ratios, n=4)
        return f"{st.median(ratios):.3f} (quartiles {q[0]:.3f} .. {q[2]:.3f}, {len(ratios)} rounds)"
    return f"{st.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})"


def table(rows, refs):
    """One Markdown table for the rows of one bench, stack and metric."""
    by = OrderedDict()
    for r in rows:
        if r["value"] is not None:
            by.setdefault(r["contender"], {})[r["round"]] = r["value"]
    refs = [c for c in refs if c in by]
    unit = rows[0]["unit"]
    head = f"| contender | {rows[0]['metric']}{', ' + unit if unit else ''}: median (range) | rounds |"
    head += "".join(f" / {c} |" for c in refs)
    lines = [head, "|---" * (3 + len(refs)) + "|"]
    for who, values in by.items():
        v = list(values.values())
        line = f"| {who} | {fmt(st.median(v))} ({fmt(min(v))} - {fmt(max(v))}) | {len(v)} |"
        for c in refs:
            base = by[c]
            line += " - |" if c == who else f" {summary([values[k] / base[k] for k in values if base.get(k)])} |"
        lines.append(line)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--ref", action="append", default=None)
    ap.add_argument("--bench")
    a = ap.parse_args()
    rows = [json.loads(line) for f in a.files for line in open(f) if line.strip()]
    benches = OrderedDict()
    for r in rows:
        if a.bench is None or r["bench"] == a.bench:
            benches.setdefault(r["bench"], []).append(r)
    for bench, rs in benches.items():
        commits = sorted({r["commit"] for r in rs})
        dates = sorted(r["date"] for r in rs)
        print(f"## {bench}: commit {', '.join(commits)}; {dates[0]} .. {dates[-1]}; {rs[0]['machine']}\n")
        refs = a.ref or DEFAULT_REFS.get(bench) or [rs[0]["contender"]]
        groups = OrderedDict()
        for r in rs:
            groups.setdefault((r["stack"], r["metric"]), []).append(r)
        for (stack, metric), g in groups.items():
            print(f"{stack}, {metric}:\n")
            print(table(g, refs))
            print()


if __name__ == "__main__":
    main()
