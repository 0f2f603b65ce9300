"""The Python baseline of bench/lm_bench.sh and scripts/gpu.sh: nanoGPT's GPT (tests/python/nanogpt_ref.py,
the model mpiddp is tested equal to) under PyTorch DDP, started by mpirun the SuperCloud way (rank
and size from Open MPI's variables), nanoGPT's loop: micro-batches of windows drawn from the llm.c
shard in DistributedSampler's order, loss / K, DDP's sync only on the last (no_sync), clip, AdamW
with nanoGPT's groups. On CUDA, nanoGPT's choices there: its flash attention
(F.scaled_dot_product_attention), fused AdamW, batches copied with non_blocking, bf16 by autocast
(--precision bf16), one GPU per node-local rank; --compile: torch.compile(model) before DDP wraps it,
as nanoGPT's train.py does by default (its first steps compile: --timed-from leaves them out). Prints
one JSON line on rank 0 when done: the parameter count (distinct tensors, as llm.c counts for MFU)
and the tokens/s of the steps after --timed-from (all ranks' tokens; the clock read after
torch.cuda.synchronize() on CUDA).

usage: mpirun -np N python3 bench/python_gpt_ddp.py SHARD STEPS L H C T BATCH ACCUM [THREADS] [PORT]
           [--device cpu|cuda] [--backend gloo|nccl] [--precision fp32|bf16] [--vocab V] [--timed-from K] [--compile]
           [--profile FILE [--profile-from K] [--profile-steps M]]
--profile: torch.profiler over M steps after K (as mpiddp train's options of the same names), a Chrome
trace per rank (FILE.rank<r>.json), for bench/profile_summary.py beside mpiddp's.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
import nanogpt_ref as ng  # noqa: E402


class FlashAttention(ng.CausalSelfAttention):
    """nanoGPT's fast path where torch has it (2.0+): F.scaled_dot_product_attention, causal. Kept
    out of nanogpt_ref.py, whose model TorchScript also compiles on torch 1.13."""

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # dropout 0, as configured
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def arguments():
    ap = argparse.ArgumentParser()
    for name in ("shard", "steps", "n_layer", "n_head", "n_embd", "block", "batch", "accum"):
        ap.add_argument(name)
    ap.add_argument("threads", nargs="?", default="1")
    ap.add_argument("port", nargs="?", default="29533")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--timed-from", type=int, default=0, help="steps before the tokens/s clock starts")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (nanoGPT's default)")
    ap.add_argument("--profile", default="", help="Chrome trace of --profile-steps steps (FILE.rank<r>.json)")
    ap.add_argument("--profile-from", type=int, default=10)
    ap.add_argument("--profile-steps", type=int, default=3)
    return ap.parse_args()


def stop_profile(profiler, path, rank, cuda):
    if cuda:
        torch.cuda.synchronize()
    profiler.stop()
    stem, ext = os.path.splitext(path)
    profiler.export_chrome_trace(f"{stem}.rank{rank}{ext or '.json'}")


def main():
    a = arguments()
    steps, block, batch, accum = int(a.steps), int(a.block), int(a.batch), int(a.accum)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", a.port)
    os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch 2.x is built without libuv
    torch.set_num_threads(int(a.threads))
    cuda = a.device == "cuda"
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(a.backend, rank=rank, world_size=size)
    torch.manual_seed(0)
    model = ng.GPT(ng.Config(int(a.n_layer), int(a.n_head), int(a.n_embd), block, a.vocab)).to(device)
    if cuda:
        for b in model.transformer.h:
            b.attn.__class__ = FlashAttention
    params = sum(p.numel() for p in model.parameters())  # parameters() yields the tied weight once
    ddp = DDP(torch.compile(model) if a.compile else model, device_ids=[device.index] if cuda else None)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), fused=cuda)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if a.precision == "bf16" \
        else contextlib.nullcontext()
    tokens = ng.read_shard(a.shard)
    n = (tokens.numel() - 1) // block
    order = list(range(n))
    order += order[:(-n) % size]
    mine = order[rank::size]
    rows = batch * accum

    def clock():
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    profiler = None
    t0 = clock()
    for it in range(steps):
        if it == a.timed_from:
            t0 = clock()
        if a.profile and it == a.profile_from:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            profiler = torch.profiler.profile(activities=acts)
            profiler.start()
        if profiler and it == a.profile_from + a.profile_steps:
            stop_profile(profiler, a.profile, rank, cuda)
            profiler = None
        first = (it * rows) % (len(mine) - rows)
        for j in range(accum):
            x, y = ng.windows(tokens, block, mine[first + j * batch:first + (j + 1) * batch])
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            sync = ddp.no_sync() if j < accum - 1 else contextlib.nullcontext()
            with sync:
                with autocast:
                    loss = ddp(x, y)[1] / accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    seconds = clock() - t0
    if profiler:
        stop_profile(profiler, a.profile, rank, cuda)
    dist.barrier()
    if rank == 0:
        timed = steps - min(a.timed_from, steps)
        print(json.dumps({"steps": steps, "done_unix_s": time.time(), "params": params, "compiled": a.compile,
                          "loss": loss.item() * accum,
                          "tokens_per_s": timed * rows * block * size / seconds if timed else None}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
