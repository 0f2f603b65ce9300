"""A torchrun-style DDP script, as cluster users write them (the AWS DDP checks' shape): the rank
and world from torchrun's environment, init_process_group("gloo") by env://, DistributedSampler,
DistributedDataParallel. Trains a small regression model on a fixed synthetic set; rank 0 writes
the final parameters (JSON) and every rank prints what it was told (and writes it to OUT.rankR).

  python torchrun_ddp.py OUT.json [--nccl]   (under torchrun or `mpiddp launch`; --nccl: NCCL on cuda:LOCAL_RANK)
  python torchrun_ddp.py OUT.json --reference RANKS [--nccl]
      one process, no torch.distributed: the same steps with the global batch of RANKS ranks (--nccl:
      on cuda:0, so that a CUDA run is compared with CUDA arithmetic, not the CPU's)
      (DistributedSampler without shuffling gives step s the samples s*b*RANKS ... (s+1)*b*RANKS-1,
      and DDP's average of the ranks' mean gradients is the global batch's mean gradient).
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BATCH, EPOCHS, SAMPLES = 4, 2, 96  # SAMPLES divisible by BATCH x every world size 1-4


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


def model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train(net, loader, sampler=None, device="cpu"):
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(EPOCHS):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()


def save(net, path):
    with open(path, "w") as f:
        json.dump({k: v.flatten().tolist() for k, v in net.state_dict().items()}, f)


def main():
    out = sys.argv[1]
    if "--reference" in sys.argv:
        ranks = int(sys.argv[sys.argv.index("--reference") + 1])
        device = "cuda:0" if "--nccl" in sys.argv else "cpu"
        net = model().to(device)
        train(net, DataLoader(data(), batch_size=BATCH * ranks, shuffle=False), device=device)
        save(net, out)
        return
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    nccl = "--nccl" in sys.argv
    device = f"cuda:{local}" if nccl else "cpu"
    if nccl:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if nccl else "gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    assert dist.get_rank() == rank and dist.get_world_size() == world
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "OMP_NUM_THREADS")
    told = f"{socket.gethostname()} " + " ".join(f"{n}={os.environ.get(n)}" for n in names)
    print(told, flush=True)
    with open(f"{out}.rank{rank}", "w") as f:  # the same, apart from other ranks' output
        f.write(told + "\n")
    ds = data()
    sampler = DistributedSampler(ds, shuffle=False)
    net = DDP(model().to(device), device_ids=[local] if nccl else None)
    train(net, DataLoader(ds, batch_size=BATCH, sampler=sampler), sampler, device)
    t = torch.tensor([float(local)], device=device)
    dist.all_reduce(t)  # every rank reached the end
    if rank == 0:
        save(net.module, out)
    dist.barrier()  # leave together: once (torch 2.11, gloo) a rank aborted in teardown while rank 0 still wrote
    dist.destroy_process_group()
    # Then leave without the interpreter's teardown: torch 2.11's C++ destructors at exit aborted a
    # rank under the agent store twice (SIGABRT, "terminate called without an active exception"),
    # its work done, saved and its group destroyed. What is checked is launch's contract, not that.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
