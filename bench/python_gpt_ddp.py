"""The Python baseline of bench/lm_bench.sh: nanoGPT's GPT (tests/python/nanogpt_ref.py, the model
mpiddp is tested equal to) under PyTorch DDP with gloo, started by mpirun the SuperCloud way (rank
and size from Open MPI's variables), nanoGPT's loop: micro-batches of windows drawn from the llm.c
shard in DistributedSampler's order, loss / K, DDP's sync only on the last (no_sync), clip, AdamW
with nanoGPT's groups. Prints one JSON line on rank 0 when done.

usage: mpirun -np N python3 bench/python_gpt_ddp.py SHARD STEPS L H C T BATCH ACCUM [THREADS] [PORT]
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
import nanogpt_ref as ng  # noqa: E402


def main(shard, steps, n_layer, n_head, n_embd, block, batch, accum, threads="1", port="29533"):
    steps, block, batch, accum = int(steps), int(block), int(batch), int(accum)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", port)
    os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch 2.x is built without libuv
    torch.set_num_threads(int(threads))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.manual_seed(0)
    model = ng.GPT(ng.Config(int(n_layer), int(n_head), int(n_embd), block, 256))
    ddp = DDP(model)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    tokens = ng.read_shard(shard)
    n = (tokens.numel() - 1) // block
    order = list(range(n))
    order += order[:(-n) % size]
    mine = order[rank::size]
    rows = batch * accum
    for it in range(steps):
        first = (it * rows) % (len(mine) - rows)
        for j in range(accum):
            x, y = ng.windows(tokens, block, mine[first + j * batch:first + (j + 1) * batch])
            if j < accum - 1:
                with ddp.no_sync():
                    (ddp(x, y)[1] / accum).backward()
            else:
                (ddp(x, y)[1] / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"steps": steps, "done_unix_s": time.time()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
