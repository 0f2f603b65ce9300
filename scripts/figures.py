#!/usr/bin/env python3
"""The figure tables of README.md, docs/performance.md and docs/gpu.md, generated from the records
in bench/results/ (figures are data: a page that quotes a measurement is generated from its record).

usage: scripts/figures.py          rewrite the pages' generated blocks from the records
       scripts/figures.py --check  exit 1, naming the page and the block, where a page differs

A generated block is the text between `<!-- figures NAME -->` and `<!-- end -->`; PAGES lists the
blocks each page must hold. RECORDS names the files each benchmark's figures come from, in one
place, so that every page quoting a benchmark quotes the same run: a new run's figures reach the
pages when its file is named there and this script is rerun. Each block names its files. Every
number in a block is read from those files or computed from them by bench/report.py's rules (a
median over rounds; a ratio between two contenders taken round by round, then its median).
Python's standard library only.
"""
import json
import os
import re
import statistics as st
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import report  # noqa: E402  (bench/report.py: the records' reader and its rules)

# The files each benchmark's figures come from (in bench/results/). Where a benchmark takes several,
# their rounds are kept apart; zero-fit's cells are read in order, a later file's cell replacing an
# earlier one's (the same size, stage and ranks measured again).
RECORDS = {
    "comm": ["bench-comm-2026-11-26-house-ab.jsonl"],
    "train": ["bench-train-2026-11-24-fused-records.jsonl", "bench-train-2026-11-25-pip-records.jsonl"],
    "floor": ["bench-floor-2026-11-24-records.jsonl"],
    "lm": ["bench-lm-2026-11-25-openblas-records.jsonl", "bench-lm-2026-11-25-pip-records.jsonl"],
    "snapshot": ["bench-snapshot-2026-11-27-40b545f-dirty.jsonl"],
    "zero 6 layers": ["bench-zero-2026-11-27-5e19c9a-round-1.jsonl", "bench-zero-2026-11-27-5e19c9a-rounds-2-3.jsonl"],
    "zero 12 layers": ["bench-zero-2026-11-27-05a26d1-12-layers.jsonl"],
    "zero block 64": ["bench-zero-2026-11-29-df74151.jsonl"],  # 6 layers, block 64, micro-batch 2
    # block 64, 1152 wide; then GPT-2's width and context (768 wide, block 1024)
    "zero-fit": ["bench-zero-fit-2026-11-27-f9b2d86.jsonl", "bench-zero-fit-2026-11-27-8e74d4a.jsonl",
                 "bench-zero-fit-2026-11-27-f7d2b82.jsonl", "bench-zero-fit-2026-11-27-8cbd763.jsonl",
                 "bench-zero-fit-2026-11-27-a501dcc.jsonl",
                 "bench-zero-fit-2026-11-28-d279bb8.jsonl", "bench-zero-fit-2026-11-28-d279bb8-dirty.jsonl",
                 "bench-zero-fit-2026-11-28-0ebb23c.jsonl", "bench-zero-fit-2026-11-28-1d5ed8e.jsonl",
                 "bench-zero-fit-2026-11-28-1d5ed8e-dirty.jsonl", "bench-zero-fit-2026-11-28-1a8f417.jsonl",
                 "bench-zero-fit-2026-11-28-4e0748f.jsonl", "bench-zero-fit-2026-11-28-d8716cc.jsonl",
                 "bench-zero-fit-2026-11-28-ecc7128.jsonl"],
    # each run its own rows, labelled with the model it measured
    "checkpoint": [("GPT 6 × 384", "bench-checkpoint-2026-11-26-c1c28d8-dirty.jsonl"),
                   ("GPT 4 × 256", "bench-checkpoint-2026-11-26-8ca288b.jsonl")],
    "resnet": ["bench-resnet-2026-11-23-records.jsonl"],
    "pt2": ["bench-pt2-2026-11-29-3cea678-dirty.jsonl"],
    "soak": ["bench-soak-2026-11-25-records.jsonl"],
    "options": ["bench-options-2026-11-24-records.jsonl"],
    # one round of scripts/gpu.sh on the device machine: its own files (PREFIX-figures.jsonl, ...), not records
    "gpu": "gpu-h200-2026-11-28-waits",
}
GPU_FILES = ["figures.jsonl", "figures.md", "summary.txt", "profile.md", "loss_kernels.jsonl"]

# The goals the tables say met or not (the issues' targets).
TARGETS = {"comm busbw": 0.95, "comm small us": 2.0, "toy": 30.0, "cnn": 1.05, "lm": 1.10, "ideal share": 80.0,
           "stage 3 vs stage 2": 0.90, "snapshot growth": 25.0, "checkpointing saved": 40.0, "gpu ddp": 2.0}


def files(name):
    if name == "gpu":
        return [f"{RECORDS['gpu']}-{s}" for s in GPU_FILES]
    return [f if isinstance(f, str) else f[1] for f in RECORDS[name]]


def rows_of(name):
    return report.load([os.path.join(RESULTS, f) for f in files(name)])


def gpu_path(suffix):
    return os.path.join(RESULTS, f"{RECORDS['gpu']}-{suffix}")


# -- formatting: numbers as bench/report.py writes them, ratios with a ×

def times(x):
    return f"{x:.1f}×" if x >= 10 else f"{x:.2f}×"


def med_range(d):
    """A {round: value}'s median (range), or its one value."""
    v = list(d.values())
    if len(v) == 1:
        return report.fmt(v[0])
    return f"{report.fmt(st.median(v))} ({report.fmt(min(v))} - {report.fmt(max(v))})"


def ratio_rounds(rat, bold=False):
    """The median of per-round ratios, then every round's (sorted)."""
    b = "**" if bold else ""
    if len(rat) == 1:
        return b + times(rat[0]) + b
    return f"{b}{times(st.median(rat))}{b} ({', '.join(f'{r:.1f}' if r >= 10 else f'{r:.2f}' for r in rat)})"


def span(xs, f=lambda x: f"{x:.2f}"):
    """'a–b' of the smallest and the largest, or one value."""
    lo, hi = f(min(xs)), f(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def whole(x):
    return f"{x:.0f}"


def verdict(values, goal, at_least=True, each="round"):
    """Whether a goal is met by every value (of a round, of a size), by their median, or not."""
    meets = (lambda x: x >= goal) if at_least else (lambda x: x <= goal)
    if all(map(meets, values)):
        return f"met, every {each}"
    return "met by the median" if meets(st.median(values)) else "**not met**"


def records_line(names):
    """The files (in bench/results/); several as one name with the parts that differ in braces."""
    if len(names) == 1:
        return f"Records: `{names[0]}`."
    head = os.path.commonprefix(names)
    head = head[:head.rfind("-") + 1]
    tail = os.path.commonprefix([n[::-1] for n in names])[::-1]
    cut = [i for i in (tail.find("-"), tail.find(".")) if i >= 0]
    tail = tail[min(cut):] if cut else ""
    return f"Records: `{head}{{{', '.join(n[len(head):len(n) - len(tail)] for n in names)}}}{tail}`."


def table(head, rows):
    """A Markdown table: the head's cells, then each row's."""
    line = lambda cells: "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"  # noqa: E731
    return [line(head), "|---" * len(head) + "|"] + [line(r) for r in rows]


# -- docs/performance.md: each block returns (its Markdown, the files it read)

COMM_PAGE_SIZES = [8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]  # the page's rows


def comm_figures():
    sizes = report.comm_sizes(rows_of("comm"))
    t = report.comm_summary(sizes)
    reps = len(sizes[0][1]["plain"]["time"])
    big, small = t["big"], t["small"]
    bw, us = TARGETS["comm busbw"], TARGETS["comm small us"]
    rows = [["mpi / plain busbw from 1 MiB, median (min)", f"{st.median(big):.2f} ({min(big):.2f})",
             f"≥ {bw:g}: {verdict(big, bw, each='size')}"],
            ["mpi − plain time up to 4 KiB, median (max)", f"{st.median(small):+.2f} µs ({max(small):+.2f})",
             f"≤ {us:g} µs: {verdict(small, us, at_least=False, each='size')}"]]
    if t["gloo"]:
        rows.append(["gloo / plain busbw, the same", f"{st.median(t['gloo']):.2f}", ""])
    if t["before"]:
        rows.append(["an earlier build's mpi / plain busbw, the same", f"{st.median(t['before']):.2f}", ""])
    lines = report.comm_table(sizes, COMM_PAGE_SIZES) + [
        "", f"Medians of {reps} repetitions. Over every size in the record "
        f"({report.human_bytes(sizes[0][0])} to {report.human_bytes(sizes[-1][0])}):", ""]
    return "\n".join(lines + table(["", "this run", "target"], rows)), files("comm")


TRAIN = {"python": "Python DDP (gloo), 2 ranks", "fused": "Python DDP (gloo), Adam(fused=True), 2 ranks",
         "hand": "hand-written libtorch + MPI, 2 ranks", "mpiddp": "mpiddp, 2 ranks", "single": "1 process, 2 threads"}


def stacks(rows):
    return list(dict.fromkeys(r["stack"] for r in rows))


def train_ratios(rows, stack, workload):
    """{key of TRAIN: {round: throughput}}, mpiddp / Python round by round, and the first steps."""
    v = {k: report.values(rows, c, f"{workload} throughput", stack) for k, c in TRAIN.items()}
    first = {k: report.values(rows, TRAIN[k], f"{workload} time to first step", stack) for k in ("mpiddp", "python")}
    return v, report.ratios(v["mpiddp"], v["python"]), first


def train_figures():
    rows, out = rows_of("train"), []
    med = lambda d: report.fmt(st.median(d.values()))  # noqa: E731
    for stack in stacks(rows):
        for workload, unit in (("toy", "steps/s"), ("cnn", "samples/s")):
            v, rat, first = train_ratios(rows, stack, workload)
            if not rat:
                continue
            py, ratio = med(v["python"]), ratio_rounds(rat, bold=True)
            if v["fused"]:
                py += f" (fused Adam {med(v['fused'])})"
                ratio += f"; {times(st.median(report.ratios(v['mpiddp'], v['fused'])))} fused"
            goal = TARGETS[workload]
            out.append([stack.split(" (")[0], f"{workload.upper() if workload == 'cnn' else workload}, {unit}", py,
                        med(v["hand"]), med(v["mpiddp"]), med(v["single"]), ratio,
                        f"≥ {goal:g}×: {verdict(rat, goal)}",
                        times(st.median(report.ratios(v["mpiddp"], v["hand"]))),
                        f"{st.median(first['mpiddp'].values()):.2f} s vs {st.median(first['python'].values()):.2f} s"])
    head = ["stack", "workload", "Python DDP", "hand-written", "mpiddp", "1 process × 2 threads",
            "**mpiddp / Python** (rounds)", "target", "mpiddp / hand-written", "first step, mpiddp vs Python"]
    return "\n".join(table(head, out)), files("train")


def floor_figures():
    rows = rows_of("floor")
    contenders = dict.fromkeys(r["contender"] for r in rows)
    out = [[who, med_range(report.values(rows, who, "toy step"))] for who in contenders]
    py = report.ratios(report.values(rows, "Python DDP (gloo), 2 ranks", "toy step"),
                       report.values(rows, "mpiddp train, 2 ranks", "toy step"))
    lines = table(["toy step", "µs: median (range)"], out)
    lines += ["", f"Python DDP's step / mpiddp's at 2 ranks: {ratio_rounds(py)}."]
    return "\n".join(lines), files("floor")


LM = {"mpiddp": "mpiddp, 2 ranks", "python": "Python DDP (nanoGPT's model), 2 ranks"}


def lm_stack(rows, stack):
    """Per side: tokens/s and peak RSS by round; mpiddp / Python of each, round by round."""
    tok = {k: report.values(rows, c, "throughput", stack) for k, c in LM.items()}
    rss = {k: report.values(rows, c, "peak RSS of a rank", stack) for k, c in LM.items()}
    return tok, rss, report.ratios(tok["mpiddp"], tok["python"]), report.ratios(rss["mpiddp"], rss["python"])


def lm_figures():
    rows, goal, out = rows_of("lm"), TARGETS["lm"], []
    for stack in stacks(rows):
        tok, rss, rat, mem = lm_stack(rows, stack)
        out.append([stack, med_range(tok["mpiddp"]), med_range(tok["python"]), ratio_rounds(rat, bold=True),
                    f"≥ {goal:g}×: {verdict(rat, goal)}",
                    f"{st.median(rss['mpiddp'].values()):.0f} / {st.median(rss['python'].values()):.0f}",
                    times(st.median(mem))])
    head = ["stack", "mpiddp tokens/s", "Python DDP tokens/s", "**mpiddp / Python** (rounds)", "target",
            "peak RSS of a rank, MiB: mpiddp / Python", "memory, mpiddp / Python"]
    return "\n".join(table(head, out)), files("lm")


def snapshot_stages(rows):
    return sorted({r["contender"] for r in rows if re.fullmatch(r"stage \d", r["contender"])})


def snapshot_io(rows, op, n):
    """snapshot / MPI-IO bandwidth at N ranks, repetition by repetition (OP: write or read)."""
    return report.ratios(report.values(rows, f"snapshot {op}, {n} ranks", "bandwidth"),
                         report.values(rows, f"MPI-IO {op}, {n} ranks", "bandwidth"))


def snapshot_ranks(rows):
    return sorted({int(n) for r in rows if r["metric"] == "bandwidth"
                   for n in re.findall(r", (\d+) ranks", r["contender"])})


def snapshot_figures():
    rows = rows_of("snapshot")
    med = lambda c, m: st.median(report.values(rows, c, m).values())  # noqa: E731
    base, growth, ideal = med("stage 0", "peak RSS per rank"), TARGETS["snapshot growth"], TARGETS["ideal share"]
    out = []
    for stage in snapshot_stages(rows):
        peak = med(stage, "peak RSS per rank")
        share = report.values(rows, stage, "share of ideal saving")
        cells = [stage[-1], f"{peak:.0f} ({med(stage + ', no snapshots', 'peak RSS per rank'):.0f})",
                 f"{med(stage, 'RSS growth while snapshotting, share of the file'):+.1f}%", "–", "–"]
        if share:
            m = st.median(share.values())
            cells[3:] = [f"{base - peak:.0f} MiB", f"{m:.0f}%" + ("" if m >= ideal else " (**not met**)")]
        out.append(cells)
    lines = table(["stage", "peak RSS per rank, MiB: with snapshots (without)",
                   f"growth while snapshotting, share of the file (target ≤ {growth:g}%)", "saved vs stage 0",
                   f"share of the ideal saving (goal ≥ {ideal:g}%)"], out)
    io = []
    for n in snapshot_ranks(rows):
        for who in ("snapshot", "MPI-IO"):
            io.append([f"{who}, {n} ranks"] + [report.fmt(st.median(report.values(
                rows, f"{who} {op}, {n} ranks", "bandwidth").values())) for op in ("write", "read")])
        io.append([f"snapshot / MPI-IO, {n} ranks (repetitions)"] + [ratio_rounds(snapshot_io(rows, op, n))
                                                                    for op in ("write", "read")])
    return "\n".join(lines + [""] + table(["I/O, MB/s (median)", "write", "read (verified)"], io)), files("snapshot")


AC = "--activation-checkpointing"
ZERO = ["stage 0", "stage 1", "stage 2", "stage 3", "stage 3, no prefetch", "stage 3 + checkpointing"]


def zero_runs(name):
    """Per contender of ZERO, lists in round order: its peak RSS, share of the ideal saving, tokens/s,
    and tokens/s over stage 2's, round by round."""
    rows, out = rows_of(name), {}
    s2 = report.values(rows, "stage 2", "throughput")
    for c in ZERO:
        tok = report.values(rows, c, "throughput")
        out[c] = {"peak": list(report.values(rows, c, "peak RSS per rank").values()),
                  "share": list(report.values(rows, c, "share of ideal saving").values()),
                  "tokens": list(tok.values()), "vs2": [tok[k] / s2[k] for k in tok if s2.get(k)]}
    return out


ZERO_SHAPES = {"6 layers": "zero 6 layers", "12 layers": "zero 12 layers",
               "6 layers, block 64, micro-batch 2": "zero block 64"}


def zero_figures():
    runs = {shape: zero_runs(name) for shape, name in ZERO_SHAPES.items()}
    out = []
    for c in ZERO:
        cells = [c.replace("no prefetch", "`--zero-no-prefetch`").replace("+ checkpointing", f"+ `{AC}`")]
        for r in runs.values():
            b = "**" if c == "stage 3" else ""
            cells += [", ".join(f"{x:.0f}" for x in r[c]["peak"]),
                      b + ", ".join(f"{x:.0f}%" for x in r[c]["share"]) + b if r[c]["share"] else "–",
                      ", ".join(f"{x:.0f}" for x in r[c]["tokens"]),
                      b + ", ".join(f"{x:.2f}" for x in r[c]["vs2"]) + b if c not in ZERO[:3] else ""]
        out.append(cells)
    head = ["contender"] + [h for n in runs for h in (f"{n}: peak RSS per rank, MiB", "share of the ideal saving",
                                                       "tokens/s", "vs stage 2")]
    share = [x for r in runs.values() for x in r["stage 3"]["share"]]
    vs2 = [x for r in runs.values() for x in r["stage 3"]["vs2"]]
    goal_share, goal_vs2 = TARGETS["ideal share"], TARGETS["stage 3 vs stage 2"]
    lines = table(head, out) + ["", f"Goals for stage 3: ≥ {goal_share:g}% of the ideal saving "
                                    f"({verdict(share, goal_share)}), ≥ {goal_vs2:.2f}× stage 2's tokens/s "
                                    f"({verdict(vs2, goal_vs2)})."]
    return "\n".join(lines), [f for name in ZERO_SHAPES.values() for f in files(name)]


FIT_STAGES = ["stage 0", "stage 2", "stage 2 + checkpointing", "stage 3", "stage 3 + checkpointing"]


def fit_cells(name):
    """{group: {stage: {layers: {params, trained, peak}}}}, group = the records' stack (limit, ranks,
    shape); a later file's cell replaces an earlier one's."""
    cells = {}
    for r in sorted(rows_of(name), key=lambda r: r["round"]):
        size, what = r["metric"].rsplit(": ", 1)
        layers, params = (int(x) for x in re.match(r"(\d+) layers \((\d+) M parameters\)", size).groups())
        cell = cells.setdefault(r["stack"], {}).setdefault(r["contender"], {}).setdefault(layers, {"params": params})
        cell["trained" if what.startswith("trained") else "peak"] = r["value"]
    return cells


def fit_largest(sizes):
    """The largest size that trained ({params, peak, layers}) and the parameters of the smallest
    larger one that ran out of memory (None where none did); (None, None) where none trained."""
    ok = [n for n, c in sizes.items() if c.get("trained") == 1]
    if not ok:
        return None, None
    top = max(ok)
    oom = [c["params"] for n, c in sorted(sizes.items()) if n > top and c.get("trained") == 0]
    return dict(sizes[top], layers=top), (oom[0] if oom else None)


def fit_ratio(largest):
    """Stage 3 + checkpointing's largest over stage 2's ({stage: (M parameters, whether a larger one
    ran out of memory)}): "≥" where stage 3's is only a lower bound; empty where stage 2's is."""
    a, b = largest.get("stage 3 + checkpointing"), largest.get("stage 2")
    if not a or not b or not b[1]:
        return ""
    return ("" if a[1] else "≥ ") + times(a[0] / b[0])


def fit_table(name):
    """The table's rows, and per group {stage: (M parameters, whether a larger one ran out of memory)}."""
    cells = fit_cells(name)
    stages = [s for s in FIT_STAGES if any(s in g for g in cells.values())]
    out, largest = [], {}
    for group, by in cells.items():
        limit = float(re.search(r"limit ([\d.]+) GiB", group).group(1))
        row, largest[group] = [group], {}
        for s in stages:
            top, oom = fit_largest(by.get(s, {}))
            if top is None:
                row.append("–")
                continue
            largest[group][s] = (top["params"], oom is not None)
            at = ", at the limit" if top["peak"] >= 0.995 * limit else ""
            more = f"; {oom} M out of memory" if oom else "; none larger run"
            size = f"**{top['params']} M**" if oom else f"at least {top['params']} M"
            row.append(f"{size} ({top['layers']} layers, {top['peak']:.2f} GiB{at}{more})")
        out.append(row + [fit_ratio(largest[group])])
    head = ["memory limit of the job, ranks, shape"] + stages + ["stage 3 + checkpointing / stage 2"]
    return table(head, out), largest


def zero_fit_figures():
    lines, _ = fit_table("zero-fit")
    return "\n".join(lines + ["", "–: not in the records."]), files("zero-fit")


def checkpoint_runs():
    """Per labelled run and block: the medians of peak RSS plain and checkpointed, the saving, the
    checkpointed / plain tokens/s round by round, the rounds."""
    out = []
    for label, f in RECORDS["checkpoint"]:
        rows = report.load([os.path.join(RESULTS, f)])
        for block in sorted({int(re.match(r"block (\d+)", r["metric"]).group(1)) for r in rows}):
            peak = {c: report.values(rows, c, f"block {block}: peak RSS per rank") for c in ("plain", AC)}
            tok = {c: report.values(rows, c, f"block {block}: throughput") for c in ("plain", AC)}
            p, a = st.median(peak["plain"].values()), st.median(peak[AC].values())
            out.append({"label": label, "block": block, "plain": p, "ac": a, "saved": 100 * (1 - a / p),
                        "tokens": report.ratios(tok[AC], tok["plain"]), "rounds": len(peak["plain"])})
    return out


def checkpoint_figures():
    out = [[r["label"], str(r["block"]), str(r["rounds"]), f"{r['plain']:.0f} / {r['ac']:.0f}",
            f"**{r['saved']:.0f}%**", ratio_rounds(r["tokens"])] for r in checkpoint_runs()]
    head = ["model", "block", "rounds", "peak RSS per rank, MiB: plain / checkpointed",
            f"saved (goal at the longest block: ≥ {TARGETS['checkpointing saved']:g}%)",
            "tokens/s, checkpointed / plain (rounds)"]
    return "\n".join(table(head, out)), files("checkpoint")


RESNET = {"python": "Python DDP (gloo), eager torchvision model", "mpiddp": "mpiddp, the TorchScript file"}


def resnet_ratio(rows):
    return report.ratios(*(report.values(rows, RESNET[k], "throughput") for k in ("mpiddp", "python")))


def resnet_figures():
    rows, out = rows_of("resnet"), []
    for c in RESNET.values():
        acc = report.values(rows, c, "test accuracy after 1 epoch").values()
        run = report.values(rows, c, "whole run").values()
        out.append([c, med_range(report.values(rows, c, "throughput")), ", ".join(f"{x:.2f}%" for x in acc),
                    ", ".join(f"{x:.0f}" for x in run)])
    head = ["contender", "samples/s: median (range)", "test accuracy after 1 epoch (rounds)", "whole run, s (rounds)"]
    lines = table(head, out) + ["", f"mpiddp / Python DDP samples/s: {ratio_rounds(resnet_ratio(rows))}."]
    return "\n".join(lines), files("resnet")


PT2 = {"builtin": "built-in (C++)", "torchscript": "TorchScript", "pt2": "torch.export (.pt2)"}
PT2_PARTS = {"cnn": "CNN, batch 64", "mlp": "MLP 20-128-64-1, batch 32", "gpt": "GPT 4 × 256, batch 8 × 128"}


def pt2_figures():
    """The executor's steady step time against the same model built in C++ and as TorchScript."""
    rows, out = rows_of("pt2"), []
    for part, label in PT2_PARTS.items():
        for ranks in ("1 rank", "2 ranks"):
            metric = f"{part} step time, {ranks}"
            steps = {who: report.values(rows, c, metric) for who, c in PT2.items()}
            if not steps["pt2"]:
                continue
            out.append([f"{label}, {ranks}", med_range(steps["pt2"]),
                        ratio_rounds(report.ratios(steps["pt2"], steps["builtin"])),
                        ratio_rounds(report.ratios(steps["pt2"], steps["torchscript"]))])
    head = ["model", ".pt2 step, ms: median (range)", "/ C++", "/ TorchScript"]
    return "\n".join(table(head, out)), files("pt2")


def soak_figures():
    out = []
    for r in rows_of("soak"):
        sign = "+" if r["value"] > 0 and ("growth" in r["metric"] or "slope" in r["metric"]) else ""
        out.append([r["metric"], f"{sign}{report.fmt(r['value'])} {r['unit']}"])
    return "\n".join(table(["", ""], out)), files("soak")


def options_figures():
    rows = rows_of("options")

    def one(contender, metric):  # a value of the one round
        return next(iter(report.values(rows, contender, metric).values()))

    def prefetch(what, n):  # --prefetch 2 / --prefetch 0 samples/s
        metric = f"{what} at {n} ranks: throughput"
        return one("prefetch=2", metric) / one("prefetch=0", metric)

    def precision(w):
        bf16, fp32 = one("bf16", f"{w} at 2 ranks: throughput"), one("fp32", f"{w} at 2 ranks: throughput")
        return f"{w.upper()} {report.fmt(bf16)} vs {report.fmt(fp32)} ({times(bf16 / fp32)})"

    acc = {p: one(f"mlp {p}, 3 epochs", "accuracy: test accuracy after epoch 3") for p in ("bf16", "fp32")}
    epochs = sorted({int(m.group(1)) for m in (re.search(r"^defaults: test accuracy after epoch (\d+)$", r["metric"])
                                               for r in rows) if m})
    dflt = [one("cnn, defaults, 3 epochs", f"defaults: test accuracy after epoch {e}") for e in epochs]
    out = [["`--prefetch 2` / `--prefetch 0` samples/s, MLP from memory (1 / 2 ranks)",
            f"{prefetch('mlp memory', 1):.2f} / {prefetch('mlp memory', 2):.2f}"],
           ["the same, MLP from the file", f"{prefetch('mlp file', 1):.2f} / {prefetch('mlp file', 2):.2f}"],
           ["the same, CNN from memory / from the file (2 ranks)",
            f"{prefetch('cnn memory', 2):.2f} / {prefetch('cnn file', 2):.2f}"],
           ["bf16 / fp32 samples/s (2 ranks)", f"{precision('cnn')}, {precision('mlp')}"],
           ["MLP test accuracy after 3 epochs, bf16 vs fp32", f"{acc['bf16']:.2f}% vs {acc['fp32']:.2f}%"],
           [f"the defaults' CNN, test accuracy after epochs {', '.join(map(str, epochs))}",
            ", ".join(f"{x:.2f}%" for x in dflt[:-1]) + f", **{dflt[-1]:.2f}%**"]]
    return "\n".join(table(["question", "result"], out)), files("options")


# -- docs/gpu.md: the GPU stage's files

def gpu_rows():
    with open(gpu_path("figures.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def gpu_name():
    with open(gpu_path("figures.md"), encoding="utf-8") as f:
        return f.readline().split("GPU:", 1)[1].strip()


GPU_MODELS = {"cnn": "CNN", "mlp_wide": "the wide MLP (`mlp_wide`)", "resnet18": "ResNet-18 (TorchScript for mpiddp)"}


def gpt2_table(g):
    """GPT-2 small's contenders: tokens/s, MFU, the whole run's seconds, mpiddp over each."""
    out = []
    for who, side in g["sides"].items():
        rat = g["ratios_to"].get(who)
        out.append([report.GPT2_CONTENDERS[who][1], str(side["batch"]), med_range(dict(enumerate(side["tokens"]))),
                    report.mfu_text(side["mfu"]), f"{st.median(side['seconds']):.1f}",
                    ratio_rounds(rat, bold=who == g["peer"]) if rat else ""])
    head = ["GPT-2 small, bf16, one rank", "micro-batch", "tokens/s", "MFU", "whole run, s (start-up included)",
            "mpiddp / it (rounds)"]
    mfu = ("MFU: mpiddp's own record's (its flops/s over the GPU's peak); the others' in proportion to their "
           "tokens/s." if g["sides"]["mpiddp"]["mfu"] else "MFU: –, not in these rounds' records (they predate "
           "mpiddp's recorded MFU; the next GPU round carries it).")
    return table(head, out) + ["", mfu]


def gpu_figures():
    rows, gpu, out = gpu_rows(), gpu_name(), []
    for model, label in GPU_MODELS.items():
        m, p = report.gpu_samples(rows, model)
        if m and p:
            out.append([f"{label}, samples/s", med_range(m), med_range(p), ratio_rounds(report.ratios(m, p))])
    head = [f"{gpu}, one rank", "mpiddp (nccl)", "Python DDP (nccl, eager)", "mpiddp / Python (rounds)"]
    g = report.gpu_gpt2(rows)
    return "\n".join(table(head, out) + ([""] + gpt2_table(g) if g else [])), files("gpu")[:2]


def gpu_ddp_figures():
    rows, goal, out = gpu_rows(), TARGETS["gpu ddp"], []
    for model in ("cnn", "mlp"):
        d = report.gpu_ddp(rows, model)
        if d:
            med = st.median(d["over"])
            out.append([model.upper(), f"{d['step_ms']:.2f}",
                        f"{med:+.1f}% ({d['q1']:+.1f}% .. {d['q3']:+.1f}%; {len(d['over'])})",
                        "met" if med <= goal else "**not met**",
                        f"{st.median(d['gpu_ms']):.3f} ({min(d['gpu_ms']):.3f}-{max(d['gpu_ms']):.3f})"])
    head = ["model, one rank, nccl", "DDP step, ms (median)",
            "DDP overhead over the same steps without communication: median (quartiles; blocks)",
            f"target ≤ {goal:g}%",
            "NCCL collectives' GPU time per step, ms: median (range)"]
    return "\n".join(table(head, out)), files("gpu")[:1]


def gpu_checks():
    with open(gpu_path("summary.txt"), encoding="utf-8") as f:
        checks = [line.rstrip("\n").split(" ", 1) for line in f if re.match(r"(PASS|FAIL|SKIP) ", line)]
    passed = sum(1 for v, _ in checks if v == "PASS")
    lines = [f"{passed} of {len(checks)} checks PASS.", ""] + table(["", "check: result"],
                                                                   [[v, c.replace("|", "/")] for v, c in checks])
    return "\n".join(lines), files("gpu")[2:3]


def gpu_profile():
    """profile_summary.py's per-step table as the record holds it, and the GPU memory peaks."""
    with open(gpu_path("profile.md"), encoding="utf-8") as f:
        text = f.read()
    peaks = re.findall(r"^(\w+): GPU memory used, peak (\d+) MiB$", text, re.M)
    steps = re.search(r"^\| per step, ms \|.*?\n(?=\n)", text, re.M | re.S).group(0).rstrip("\n")
    memory = ", ".join(f"{who} {mib} MiB" for who, mib in peaks)
    return "\n".join([steps, "", f"GPU memory used, peak (nvidia-smi): {memory}."]), files("gpu")[3:4]


LOSS = {"cast": "logits cast to float32, then the loss (mpiddp's)", "autocast": "autocast's bfloat16 loss (nanoGPT's)",
        "dtype": "`log_softmax` with a float32 dtype"}


def gpu_loss():
    with open(gpu_path("loss_kernels.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = [[LOSS.get(r["loss"], r["loss"]), f"{r['ms_median']:.2f}", f"{r['loss_rel_diff']:.2g}",
            f"{r['peak_gib']:.2f}"] for r in rows]
    head = ["the loss, forward and backward", "ms (median)", "loss, relative to float32", "peak GPU memory, GiB"]
    return "\n".join(table(head, out)), files("gpu")[4:5]


# -- README's results: a row per benchmark, from the same records as its section. Each row function
# returns (question, figure, link) and the benchmarks (keys of RECORDS) it reads.

def comm_row():
    t = report.comm_summary(report.comm_sizes(rows_of("comm")))
    return ("Communication vs raw MPI", f"mpi backend {times(st.median(t['big']))} a plain `MPI_Allreduce` loop's bus "
            f"bandwidth from 1 MiB (median over sizes); {st.median(t['small']):+.2f} µs per call up to 4 KiB",
            "[comm](docs/performance.md#communication-vs-raw-mpi)"), ["comm"]


def train_row():
    rows = rows_of("train")
    order = stacks(rows)
    per = {w: " / ".join(times(st.median(train_ratios(rows, s, w)[1])) for s in order) for w in ("cnn", "toy")}
    names = " / ".join(s.split(" (")[0] for s in order)
    return ("Training vs Python DDP", f"CNN {per['cnn']} samples/s; toy {per['toy']} steps/s ({names})",
            "[training](docs/performance.md#training-vs-python-ddp)"), ["train"]


def lm_row():
    rows = rows_of("lm")
    per = [lm_stack(rows, s) for s in stacks(rows)]
    return ("GPT vs nanoGPT under PyTorch DDP", f"{' / '.join(times(st.median(p[2])) for p in per)} tokens/s "
            f"({' / '.join(stacks(rows))}) at {span([st.median(p[3]) for p in per])}× the peak memory",
            "[GPT](docs/performance.md#gpt-vs-nanogpt)"), ["lm"]


def gpu_row():
    rows, gpu = gpu_rows(), gpu_name()
    samples = ", ".join(f"{label} {times(st.median(report.ratios(*report.gpu_samples(rows, model))))}"
                        for model, label in (("cnn", "CNN"), ("mlp_wide", "MLP"), ("resnet18", "ResNet-18")))
    g = report.gpu_gpt2(rows)
    ddp = [report.gpu_ddp(rows, m) for m in ("cnn", "mlp")]
    rounds = len(report.gpu_samples(rows, "cnn")[0])
    over = " / ".join(f"{st.median(d['over']):+.1f}%" for d in ddp)
    steps = " / ".join(f"{d['step_ms']:.2f}" for d in ddp)
    where = f"{gpu.replace('NVIDIA ', '')}, 1 rank, {rounds} round{'s' if rounds > 1 else ''}"
    gpt2 = ", ".join(f"{times(st.median(r))} {report.GPT2_CONTENDERS[p][0]}'s" for p, r in g["ratios_to"].items() if r)
    mfu = g["sides"]["mpiddp"]["mfu"]
    mfu = f", MFU {mfu:.1f}%" if mfu else ""
    return (f"GPU: training vs Python DDP ({where})",
            f"{samples} samples/s; GPT-2 small bf16 {gpt2} tokens/s{mfu}; DDP's overhead "
            f"{over} on the CNN's / MLP's {steps} ms steps (target {TARGETS['gpu ddp']:g}%)",
            "[GPU](docs/gpu.md#results-on-the-h200)"), ["gpu"]


def zero_row():
    z6, z12, small = (zero_runs(name) for name in ZERO_SHAPES.values())
    shares = " / ".join(span(z6[s]["share"], whole) + "%" for s in ("stage 1", "stage 2", "stage 3"))
    _, fit = fit_table("zero-fit")
    gpt2 = next(v for k, v in fit.items() if "block 1024" in k)
    block64 = next(v for k, v in fit.items() if k.endswith("4 ranks"))

    def size(largest, s):
        return f"{'' if largest[s][1] else 'at least '}{largest[s][0]} M"

    return ("ZeRO memory", f"2 ranks, a snapshot every 3 steps, a 6-layer GPT: stages 1 / 2 / 3 save {shares} of the "
            f"ideal peak RSS per rank (stage 3 {span(z12['stage 3']['share'], whole)}% at 12 layers, "
            f"{span(small['stage 3']['share'], whole)}% at block 64, micro-batch 2); stage 3 "
            f"{span(z6['stage 3']['vs2'])}× stage 2's tokens/s; under 8 GiB at 4 ranks, 768 wide at block 1024, "
            f"stage 2 trains {size(gpt2, 'stage 2')} parameters, stage 3 + checkpointing "
            f"{size(gpt2, 'stage 3 + checkpointing')} "
            f"({fit_ratio(gpt2)}); 1152 wide at block 64, "
            + ", ".join(f"{s} {size(block64, s)}" for s in FIT_STAGES if s in block64),
            "[ZeRO](docs/performance.md#zero-memory)"), [*ZERO_SHAPES.values(), "zero-fit"]


def snapshot_row():
    rows = rows_of("snapshot")
    stages_ = snapshot_stages(rows)
    growth = max(st.median(report.values(rows, s, "RSS growth while snapshotting, share of the file").values())
                 for s in stages_)
    n = snapshot_ranks(rows)[-1]
    io = {op: times(st.median(snapshot_io(rows, op, n))) for op in ("write", "read")}
    return ("Snapshots (every rank writes its part of one file)",
            f"peak RSS while snapshotting at most {growth:+.1f}% of the file's size (stages {stages_[0][-1]}-"
            f"{stages_[-1][-1]}); write {io['write']}, verified read {io['read']} a plain MPI-IO loop at {n} ranks",
            "[snapshots](docs/performance.md#snapshots)"), ["snapshot"]


def checkpoint_row():
    first = [r for r in checkpoint_runs() if r["label"] == RECORDS["checkpoint"][0][0]]
    return ("Activation checkpointing", f"{first[-1]['saved']:.0f}% less peak RSS per rank at block "
            f"{first[-1]['block']} ({first[0]['saved']:.0f}% at {first[0]['block']}), snapshots on",
            "[checkpointing](docs/performance.md#activation-checkpointing)"), ["checkpoint"]


def resnet_row():
    rows = rows_of("resnet")
    acc = {k: list(report.values(rows, c, "test accuracy after 1 epoch").values()) for k, c in RESNET.items()}
    same = acc["mpiddp"] == acc["python"]
    return ("A model from Python (ResNet-18)", f"{span(resnet_ratio(rows))}× Python DDP, " +
            ("the same test accuracy" if same else f"test accuracy {span(acc['mpiddp'])}% vs {span(acc['python'])}%"),
            "[ResNet](docs/performance.md#a-model-nobody-here-wrote-resnet-18)"), ["resnet"]


def soak_row():
    growth = next(r["value"] for r in rows_of("soak") if "growth" in r["metric"])
    return ("Soak", f"{growth:+.2f} MiB of rank 0's memory from 20% of a long toy run to its end (target < 8 MiB)",
            "[soak](docs/performance.md#soak)"), ["soak"]


README_ROWS = [comm_row, train_row, lm_row, gpu_row, zero_row, snapshot_row, checkpoint_row, resnet_row, soak_row]


def readme_results():
    out, used = [], []
    for row in README_ROWS:
        cells, benches = row()
        out.append(list(cells))
        used += [f for b in benches for f in (files(b)[:1] if b == "gpu" else files(b))]
    lines = table(["question", "current figure", "details"], out)
    return "\n".join(lines + ["", "Each row comes from the records its linked section names."]), used


# Per page, its blocks: NAME -> the function that renders it.
PAGES = {
    "README.md": {"results": readme_results},
    "docs/performance.md": {"comm": comm_figures, "train": train_figures, "floor": floor_figures, "lm": lm_figures,
                            "snapshot": snapshot_figures, "zero": zero_figures, "zero-fit": zero_fit_figures,
                            "checkpoint": checkpoint_figures, "resnet": resnet_figures,
                            "soak": soak_figures,
                            "options": options_figures},
    "docs/pt2.md": {"pt2": pt2_figures},
    "docs/gpu.md": {"gpu-checks": gpu_checks, "gpu-figures": gpu_figures, "gpu-ddp": gpu_ddp_figures,
                    "gpu-profile": gpu_profile, "gpu-loss": gpu_loss},
}
BLOCK = re.compile(r"(<!-- figures (\S+) -->\n)(.*?)(<!-- end -->)", re.S)


def render(page, name):
    """A block's text: its table, then (but in README, whose rows link to their sections) its files."""
    text, used = PAGES[page][name]()
    if page == "README.md":
        return text + "\n"
    return text + "\n\n" + records_line(used) + "\n"


def main():
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] != "--check"):
        sys.exit(__doc__)
    check = len(sys.argv) == 2
    problems = []
    for page, blocks in PAGES.items():
        path = os.path.join(ROOT, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found = [m.group(2) for m in BLOCK.finditer(text)]
        problems += [f"{page}: {found.count(n)} blocks `<!-- figures {n} -->`, want 1"
                     for n in blocks if found.count(n) != 1]
        problems += [f"{page}: block `{n}` is not one of {', '.join(blocks)} (scripts/figures.py's PAGES)"
                     for n in found if n not in blocks]
        drifted = []

        def regenerate(m):
            if m.group(2) not in blocks:
                return m.group(0)
            try:
                new = render(page, m.group(2))
            except FileNotFoundError as e:
                problems.append(f"{page}: block `{m.group(2)}`: no file {e.filename}")
                return m.group(0)
            if new != m.group(3):
                drifted.append(m.group(2))
            return m.group(1) + new + m.group(4)

        new = BLOCK.sub(regenerate, text)
        if check:
            problems += [f"{page}: block `{n}` differs from its records (rerun scripts/figures.py)" for n in drifted]
        else:
            if drifted:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
            print(f"{page}: {len(found)} blocks, {len(drifted)} rewritten")
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
