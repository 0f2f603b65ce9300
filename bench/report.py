"""Tables of benchmark records (the format of bench/lib.sh: one JSON object a line with bench,
commit, date, machine, stack, round, contender, metric, value, unit).

For each bench, stack and metric: every contender's median over rounds (and the range), and its
ratio to each reference contender, taken round by round (the same round saw the same machine noise)
and summarised by their median (with the quartiles from 8 ratios on, else every ratio, sorted).
Two benchmarks print their own tables, whose rules live here too so that a page quoting them
(scripts/figures.py) and the script that ran them say the same: comm_bench.sh's, a row per message
size, and scripts/gpu.sh's figures (its figures.jsonl, not records).

usage: python3 bench/report.py [--bench NAME] [--ref CONTENDER]... RECORDS.jsonl...
       python3 bench/report.py --comm RECORDS.jsonl...         comm_bench.sh's table
       python3 bench/report.py --gpu GPU_NAME FIGURES.jsonl    scripts/gpu.sh's figures.md
  --ref     the contenders to divide by (default: the bench's own, below, else its first contender)
  --bench   only that bench's records
Rounds of separate files are kept apart: each file's rounds are numbered on after the previous one's.
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
    "pt2": ["built-in (C++)", "TorchScript"],
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


def load(paths):
    """The records of the files in order, each file's rounds numbered on after the previous file's."""
    rows, offset = [], 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            own = [json.loads(line) for line in f if line.strip()]
        rows += [dict(r, round=r["round"] + offset) for r in own]
        offset += max((r["round"] for r in own), default=0)
    return rows


def values(rows, contender, metric, stack=None):
    """{round: value} of one contender's metric (on one stack), rounds without a value left out."""
    return {r["round"]: r["value"] for r in rows if r["contender"] == contender and r["metric"] == metric
            and (stack is None or r["stack"] == stack) and r["value"] is not None}


def ratios(num, den):
    """num / den round by round ({round: value} each), sorted: the rounds both have."""
    return sorted(num[k] / den[k] for k in num if den.get(k))


def summary(rs):
    rs = sorted(rs)
    if not rs:
        return "-"
    if len(rs) >= 8:
        q = st.quantiles(rs, n=4)
        return f"{st.median(rs):.3f} (quartiles {q[0]:.3f} .. {q[2]:.3f}, {len(rs)} rounds)"
    return f"{st.median(rs):.3f} ({', '.join(f'{r:.3f}' for r in rs)})"


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
    for who, by_round in by.items():
        v = list(by_round.values())
        line = f"| {who} | {fmt(st.median(v))} ({fmt(min(v))} - {fmt(max(v))}) | {len(v)} |"
        for c in refs:
            line += " - |" if c == who else f" {summary(ratios(by_round, by[c]))} |"
        lines.append(line)
    return "\n".join(lines)


# comm_bench.sh: float32 allreduce per message size. Each cell is the median over the repetitions
# of one contender; the ratios are between those medians (the per-repetition ratios from 1 MiB are
# printed too, for their spread).
COMM = {"plain": "plain MPI_Allreduce loop", "mpi": "mpiddp mpi", "gloo": "mpiddp gloo",
        "before": "mpiddp mpi, before (MPIDDP_BENCH_BEFORE)"}


def comm_sizes(rows):
    """[(size in bytes, {key of COMM: {"time": {round: us}, "busbw": {round: GB/s}}})] by size."""
    sizes = OrderedDict()
    for r in rows:
        if r["bench"] == "comm" and r["value"] is not None:
            head, what = r["metric"].rsplit(": ", 1)
            size = int(head.split()[-2])
            key = next(k for k, c in COMM.items() if c == r["contender"])
            sizes.setdefault(size, {}).setdefault(key, {}).setdefault(what, {})[r["round"]] = r["value"]
    return sorted(sizes.items())


def human_bytes(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b} B"


def comm_median(s, key, what):
    """The median over repetitions of one size's contender (a key of COMM) and "time" or "busbw"."""
    return st.median(s[key][what].values())


def comm_summary(sizes):
    """The targets' figures, one entry a size: mpi / plain busbw from 1 MiB ("big"), mpi - plain time
    up to 4 KiB ("small"), and from 1 MiB gloo's and an earlier build's busbw / plain where the run had them."""
    out = {"big": [], "small": [], "gloo": [], "before": []}
    for size, s in sizes:
        pb = comm_median(s, "plain", "busbw")
        if size >= 1 << 20:
            out["big"].append(comm_median(s, "mpi", "busbw") / pb)
            for k in ("gloo", "before"):
                if k in s:
                    out[k].append(comm_median(s, k, "busbw") / pb)
        if size <= 4096:
            out["small"].append(comm_median(s, "mpi", "time") - comm_median(s, "plain", "time"))
    return out


def comm_table(sizes, only=None):
    """comm_bench.sh's table: a row per size (those in ONLY, if given), medians over the repetitions."""
    m = comm_median
    lines = ["| size | plain MPI time (us) | mpiddp mpi time (us) | Δ time (us) | plain busbw (GB/s) "
             "| mpiddp mpi busbw | mpi / plain busbw | gloo busbw | gloo / plain busbw |", "|---" * 9 + "|"]
    for size, s in sizes:
        if only is not None and size not in only:
            continue
        pt, mt, pb, mb = m(s, "plain", "time"), m(s, "mpi", "time"), m(s, "plain", "busbw"), m(s, "mpi", "busbw")
        g = f"{m(s, 'gloo', 'busbw'):.3f}" if "gloo" in s else "n/a"
        gr = f"{m(s, 'gloo', 'busbw') / pb:.2f}" if "gloo" in s and pb > 0 else "n/a"
        lines.append(f"| {human_bytes(size)} | {pt:.2f} | {mt:.2f} | {mt - pt:+.2f} | {pb:.3f} | {mb:.3f} | "
                     f"{mb / pb if pb else 0:.2f} | {g} | {gr} |")
    return lines


def comm_report(rows):
    sizes = comm_sizes(rows)
    lines = comm_table(sizes)
    t = comm_summary(sizes)
    lines += ["", f"From 1 MiB up, mpiddp mpi / plain MPI busbw: min {min(t['big']):.3f}, "
              f"median {st.median(t['big']):.3f} (target >= 0.95).",
              f"Up to 4 KiB, mpiddp mpi time - plain MPI time: max {max(t['small']):+.2f} us, median "
              f"{st.median(t['small']):+.2f} us (target <= 2 us).", "",
              "Per repetition, busbw / plain MPI busbw of the same repetition (plain MPI's own busbw, GB/s):"]
    for size, s in sizes:
        if size >= 1 << 20:
            plain = s["plain"]["busbw"]
            per = lambda k: " ".join(f"{v / plain[r]:.2f}" for r, v in sorted(s[k]["busbw"].items()))  # noqa: E731
            line = f"- {human_bytes(size)}: mpiddp {per('mpi')}"
            if "before" in s:
                line += f"; before {per('before')}"
            lines.append(line + "; plain " + " ".join(f"{v:.2f}" for _, v in sorted(plain.items())))
    if t["before"]:
        lines.append(f"From 1 MiB up, the earlier build's mpi / plain MPI busbw: min {min(t['before']):.3f}, "
                     f"median {st.median(t['before']):.3f}.")
    if t["gloo"]:
        lines.append(f"From 1 MiB up, gloo / plain MPI busbw: median {st.median(t['gloo']):.3f}.")
    return "\n".join(lines)


# scripts/gpu.sh's figures: samples/s of mpiddp and Python DDP per model, GPT-2 small's tokens/s and
# MFU, and mpiddp_ddp_bench's blocks (DDP and the same steps without communication).
# MFU: mpiddp's own record's (flops_per_s over the device's peak, mpiddp's rule: flops.hpp and the
# model's flops_per_token), carried by mpiddp's rows; for one model on one device MFU is proportional
# to tokens/s, so the Python side's is its tokens/s times mpiddp's mfu per token/s. Rounds whose rows
# predate the recorded MFU have none here: this script owns no FLOP formula and no peak table.


def mfu_text(mfu):
    """An MFU in % as the tables print it; '–' where the records carry none."""
    return "–" if mfu is None else f"{mfu:.1f}%"


def gpu_samples(rows, model):
    """({round: mpiddp samples/s}, {round: Python DDP samples/s}) of one model."""
    return tuple({r["round"]: r["samples_per_s"] for r in rows if r.get("who") == who and r.get("model") == model}
                 for who in ("mpiddp", "python"))


# The GPT-2 run's contenders (scripts/gpu.sh's `who`), in the tables' order: a short name and what it
# runs. Rounds before the peers were named call nanoGPT's eager run "python", and ran micro-batch 16
# without recording it.
GPT2_CONTENDERS = {
    "mpiddp": ("mpiddp", "mpiddp (nccl)"),
    "nanogpt-compiled": ("nanoGPT compiled", "nanoGPT's model, `torch.compile`, Python DDP"),
    "nanogpt-eager": ("nanoGPT eager", "nanoGPT's model, eager, Python DDP"),
    "llm.c": ("llm.c", "llm.c's `train_gpt2cu`"),
}
GPT2_PEERS = [who for who in GPT2_CONTENDERS if who != "mpiddp"]
GPT2_LEGACY = {"python": "nanogpt-eager"}
GPT2_LEGACY_BATCH = 16


def gpu_gpt2(rows):
    """GPT-2 small: per contender (mpiddp and each peer in the records) its tokens/s and whole-run
    seconds (lists), MFU in % (above; None where mpiddp's rows carry none) and micro-batch; per peer
    mpiddp's per-round ratios to it; the first peer (the one a user picks: nanoGPT compiled where
    measured). None without mpiddp and a peer."""
    g = {}
    for r in rows:
        if r.get("model") == "gpt2":
            g.setdefault(GPT2_LEGACY.get(r.get("who"), r.get("who")), []).append(r)
    peers = [p for p in GPT2_PEERS if p in g]
    if "mpiddp" not in g or not peers:
        return None
    tokens = {who: [r["tokens_per_s"] for r in rs] for who, rs in g.items()}
    per_token = None
    if all("mfu" in r for r in g["mpiddp"]):
        per_token = 100 * st.median(r["mfu"] for r in g["mpiddp"]) / st.median(tokens["mpiddp"])
    sides = {who: {"tokens": tokens[who], "seconds": [r["seconds"] for r in g[who]],
                   "mfu": st.median(tokens[who]) * per_token if per_token else None,
                   "batch": g[who][0].get("batch", GPT2_LEGACY_BATCH)} for who in ["mpiddp"] + peers}
    ratios_to = {p: sorted(m["tokens_per_s"] / q["tokens_per_s"]
                           for m in g["mpiddp"] for q in g[p] if m["round"] == q["round"]) for p in peers}
    return {"sides": sides, "ratios_to": ratios_to, "peer": peers[0]}


def gpu_ddp(rows, model):
    """mpiddp_ddp_bench's blocks of one model: DDP's overhead in % per block (sorted), its quartiles
    as the GPU stage reports them, the NCCL collectives' GPU ms per step, the DDP step's median ms."""
    d = [r for r in rows if r.get("who") == "ddp_bench" and r["model"] == model]
    over = sorted(100 * (a / b - 1) for r in d for a, b in zip(r["ddp_ms"], r["local_ms"]))
    if not over:
        return None
    return {"over": over, "q1": over[len(over) // 4], "q3": over[3 * len(over) // 4],
            "gpu_ms": [x for r in d for x in r.get("device_ms", [])],
            "step_ms": st.median(x for r in d for x in r["ddp_ms"])}


def gpu_report(rows, gpu):
    lines = [f"GPU: {gpu or 'unknown'}", "",
             "| model | mpiddp samples/s (median, range) | Python DDP samples/s | mpiddp / Python (rounds) |",
             "|---|---|---|---|"]
    for model in ["cnn", "mlp_wide", "resnet18"]:
        m, p = gpu_samples(rows, model)
        if not m or not p:
            continue
        rat = ratios(m, p)
        lines.append(f"| {model} | {st.median(m.values()):.0f} ({min(m.values()):.0f}-{max(m.values()):.0f}) | "
                     f"{st.median(p.values()):.0f} ({min(p.values()):.0f}-{max(p.values()):.0f}) | "
                     f"{st.median(rat):.2f}x ({', '.join(f'{x:.2f}' for x in rat)}) |")
    lines.append("")
    g = gpu_gpt2(rows)
    if g:
        lines += ["| GPT-2 small, bf16, micro-batch x 1024 tokens | tokens/s (median, range) | MFU "
                  "| whole run, s (median) | mpiddp / it (rounds) |",
                  "|---|---|---|---|---|"]
        for who, s in g["sides"].items():
            v, rat = s["tokens"], g["ratios_to"].get(who)
            lines.append(f"| {who} (micro-batch {s['batch']}) | {st.median(v):.0f} ({min(v):.0f}-{max(v):.0f}) | "
                         f"{mfu_text(s['mfu'])} | {st.median(s['seconds']):.1f} | "
                         + (f"{st.median(rat):.2f}x ({', '.join(f'{x:.2f}' for x in rat)})" if rat else "-") + " |")
        lines += [("MFU: mpiddp's record's, the others' in proportion to their tokens/s" if g["sides"]["mpiddp"]["mfu"]
                   else "MFU: not in these rounds' records"), ""]
    for model in ["cnn", "mlp"]:
        d = gpu_ddp(rows, model)
        if not d:
            continue
        lines.append(f"DDP overhead, {model}: median {st.median(d['over']):+.1f}% over the same steps without "
                     f"communication (quartiles {d['q1']:+.1f}% .. {d['q3']:+.1f}%, {len(d['over'])} blocks)")
        if d["gpu_ms"]:
            lines.append(f"NCCL collectives' GPU time per step, {model} (CUDA events): median "
                         f"{st.median(d['gpu_ms']):.3f} ms ({min(d['gpu_ms']):.3f}-{max(d['gpu_ms']):.3f}) "
                         f"of a {d['step_ms']:.2f} ms step")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--ref", action="append", default=None)
    ap.add_argument("--bench")
    ap.add_argument("--comm", action="store_true")
    ap.add_argument("--gpu", metavar="GPU_NAME")
    a = ap.parse_args()
    if a.gpu is not None:
        print(gpu_report([json.loads(line) for f in a.files for line in open(f) if line.strip()], a.gpu))
        return
    rows = load(a.files)
    if a.comm:
        print(comm_report(rows))
        return
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
