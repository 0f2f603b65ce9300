"""Where a profiled window's time went, from Chrome traces of PyTorch's profiler: `mpiddp train
--profile` and `bench/python_gpt_ddp.py --profile` write them. Per step of the window: the GPU's
span (first kernel's start to last kernel's end), the time some kernel, copy or memset ran (busy)
and the rest (idle: the GPU waited for the host), the kernels' time by kind, the host's waits
for the device (synchronisations and device-to-host copies: CUDA runtime calls that block) and the
host's time in CUDA runtime calls. Then each trace's kernels with the most time per step, by name
(TOP of them, default 12), and its CUDA runtime calls by time. `mpiddp_ddp_bench --profile` writes
a DDP block's trace and the same steps' without communication.

usage: python3 bench/profile_summary.py [--top TOP] STEPS LABEL=TRACE [LABEL=TRACE ...]
       (STEPS: the steps the window holds: train's --profile-steps, mpiddp_ddp_bench's --steps)
Prints a Markdown table, one column per trace.
"""
import json
import re
import sys

# Kernel kinds, first match wins (names as cuBLAS, cuDNN, flash attention, NCCL and ATen give them).
KINDS = [
    ("matmul", r"gemm|xmma|cutlass|nvjet|cublas|Kernel2|ampere_|sm90_"),
    ("attention", r"flash|fmha|attention|scaled_dot"),
    ("nccl", r"nccl"),
    ("optimizer", r"multi_tensor|fused_adam|FusedAdam|adam"),
    ("softmax, loss", r"softmax|cross_entropy|nll_loss"),
    ("layer norm", r"layer_norm|LayerNorm"),
    ("reduce", r"reduce"),
]
BLOCKING = re.compile(r"cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy(Async)?$")


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "elementwise, other"


def union_length(intervals):
    total, end = 0.0, None
    for begin, finish in sorted(intervals):
        if end is None or begin > end:
            total += finish - begin
            end = finish
        elif finish > end:
            total += finish - end
            end = finish
    return total


def summarise(path, steps):
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not device:
        return {"error": "no GPU activity in the trace"}
    span = max(e["ts"] + e["dur"] for e in device) - min(e["ts"] for e in device)
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in device])
    row = {"span": span / steps, "busy": busy / steps, "idle": (span - busy) / steps}
    kinds = {}
    for e in device:
        k = "copies, memsets" if e["cat"] != "kernel" else kind_of(e["name"])
        kinds[k] = kinds.get(k, 0.0) + e["dur"] / steps
    row["kinds"] = kinds
    by_name = {}
    for e in device:
        if e["cat"] == "kernel":
            calls, total = by_name.get(e["name"], (0, 0.0))
            by_name[e["name"]] = (calls + 1, total + e["dur"])
    row["by name"] = sorted(((t / steps, c / steps, n) for n, (c, t) in by_name.items()), reverse=True)
    row["kernels"] = sum(1 for e in device if e["cat"] == "kernel") / steps
    runtime = {}  # the host's CUDA runtime calls by name: (calls, microseconds)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime":
            calls, total = runtime.get(e["name"], (0, 0.0))
            runtime[e["name"]] = (calls + 1, total + e["dur"])
    blocking = [(c, t) for n, (c, t) in runtime.items() if BLOCKING.search(n)]
    row["host waits"] = sum(t for _, t in blocking) / steps
    row["blocking calls"] = sum(c for c, _ in blocking) / steps
    row["runtime"] = sum(t for _, t in runtime.values()) / steps
    row["runtime calls"] = sum(c for c, _ in runtime.values()) / steps
    row["runtime by name"] = sorted(((t / steps, c / steps, n) for n, (c, t) in runtime.items()), reverse=True)
    return row


def main():
    args = sys.argv[1:]
    top = 12
    if args[:1] == ["--top"]:
        top, args = int(args[1]), args[2:]
    steps = int(args[0])
    columns = [(a.split("=", 1)[0], summarise(a.split("=", 1)[1], steps)) for a in args[1:]]
    print("| per step, ms | " + " | ".join(label for label, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))

    def line(name, value):
        print(f"| {name} | " + " | ".join(value(r) for _, r in columns) + " |")

    ms = lambda v: f"{v / 1000:.2f}"  # noqa: E731  (traces count microseconds)
    for key in ("span", "busy", "idle"):
        line(f"GPU {key}", lambda r, k=key: ms(r[k]) if k in r else r.get("error", ""))
    kinds = sorted({k for _, r in columns for k in r.get("kinds", {})},
                   key=lambda k: -max(r.get("kinds", {}).get(k, 0) for _, r in columns))
    for k in kinds:
        line(f"  {k}", lambda r, k=k: ms(r.get("kinds", {}).get(k, 0)))
    line("kernels launched", lambda r: f"{r.get('kernels', 0):.0f}")
    line("host blocked on the GPU", lambda r: ms(r.get("host waits", 0)))
    line("blocking CUDA calls", lambda r: f"{r.get('blocking calls', 0):.1f}")
    line("host in CUDA runtime calls", lambda r: ms(r.get("runtime", 0)))
    line("CUDA runtime calls", lambda r: f"{r.get('runtime calls', 0):.0f}")
    for label, r in columns:
        print(f"\n{label}: the {top} kernels with the most time per step\n")
        print("| ms per step | calls per step | kind | kernel |\n|---|---|---|---|")
        for t, calls, name in r.get("by name", [])[:top]:
            print(f"| {t / 1000:.2f} | {calls:.0f} | {kind_of(name)} | {name[:110].replace('|', '/')} |")
        print(f"\n{label}: CUDA runtime calls by the host's time per step\n")
        print("| ms per step | calls per step | call |\n|---|---|---|")
        for t, calls, name in r.get("runtime by name", [])[:top]:
            print(f"| {t / 1000:.3f} | {calls:.1f} | {name} |")


if __name__ == "__main__":
    main()
