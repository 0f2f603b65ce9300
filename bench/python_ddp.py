"""The Python baseline: PyTorch DDP with gloo, started by mpirun the MIT SuperCloud way (rank and
size from Open MPI's variables, MASTER_ADDR/MASTER_PORT set by hand), a DataLoader over a
DistributedSampler with set_epoch as in the AWS CPU-DDP seed. Same HDF5 file (read whole with
h5py), models, sampler rule and optimizers as `mpiddp train`; one JSON line per epoch on rank 0
(the fields bench/train_bench.sh reads).

usage: mpirun -np N python3 bench/python_ddp.py --data F.h5 --model linear|cnn|resnet18|mlp_wide --epochs E
       --batch-size B --lr LR --optimizer sgd|adam [--fused] [--seed S] [--threads T] [--port P] [--test-data T.h5]
       [--device cpu|cuda] [--backend gloo|nccl]
       python3 bench/python_ddp.py --model M --save-script OUT.pt [--seed S]   (the same initial model, scripted,
       for `mpiddp train --model OUT.pt`; --data gives the input shape of linear)
resnet18 is torchvision's, first convolution for one channel, eager (as a Python user runs it); mlp_wide is
784-4096-4096-10 (20 M parameters) on flattened images. With --device cuda each batch moves to the GPU as a
user's loop does (non_blocking), and an epoch's seconds end after torch.cuda.synchronize().
"""
import argparse
import json
import os
import time

import h5py
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def load(path):
    with h5py.File(path, "r") as f:
        x = torch.from_numpy(f["inputs"][...])
        y = torch.from_numpy(f["targets"][...])
        if x.dtype == torch.uint8:
            x = x.float() * float(f["inputs"].attrs["scale"])
    return x, y


def make_model(kind, features, outputs):
    """(model, loss) as `mpiddp train --model KIND` builds them (linear: the data's widths)."""
    if kind == "resnet18":
        import torchvision
        model = torchvision.models.resnet18(num_classes=10)
        model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return model, F.cross_entropy
    if kind == "cnn":  # PyTorch's MNIST example network, as `mpiddp train --model cnn`
        return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5),
                             nn.Linear(128, 10)), F.cross_entropy
    if kind == "mlp_wide":  # 20 M parameters: where the all-reduce, not the arithmetic, sets the pace
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                             nn.Linear(4096, 10)), F.cross_entropy
    # the seeds' Linear(20, 1), with MSE (the seed's cross-entropy over one column never learns)
    return nn.Sequential(nn.Flatten(), nn.Linear(features, outputs)), F.mse_loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="")
    ap.add_argument("--model", default="linear", choices=["linear", "cnn", "resnet18", "mlp_wide"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    ap.add_argument("--fused", action="store_true",
                    help="Adam(fused=True): PyTorch's fused kernel, which its CPU default does not use (2.4+)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--port", default="29531")
    ap.add_argument("--test-data", default="")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--save-script", default="")
    a = ap.parse_args()
    if a.save_script:
        torch.manual_seed(a.seed)
        features = load(a.data)[0].shape[1] if a.model == "linear" else 0
        torch.jit.script(make_model(a.model, features, 1)[0]).save(a.save_script)
        return
    if not a.data:
        ap.error("--data is required")

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", 0)))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", a.port)
    os.environ.setdefault("USE_LIBUV", "0")  # PyTorch 2.x: Debian's build has no libuv TCPStore
    torch.set_num_threads(a.threads)
    device = torch.device("cuda", int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)) % max(torch.cuda.device_count(), 1)) \
        if a.device == "cuda" else torch.device("cpu")
    if a.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(a.backend, rank=rank, world_size=size)

    x, y = load(a.data)
    torch.manual_seed(a.seed)
    model, loss_fn = make_model(a.model, x.shape[1] if a.model == "linear" else 0, y.shape[1] if y.dim() > 1 else 1)
    model = DDP(model.to(device), device_ids=[device.index] if a.device == "cuda" else None)
    if a.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=a.lr, **({"fused": True} if a.fused else {}))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=size, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=a.batch_size, sampler=sampler, drop_last=True)

    first_step = 0.0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        steps = 0
        for source, targets in loader:
            if a.device == "cuda":
                source, targets = source.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            opt.zero_grad()
            loss = loss_fn(model(source), targets)
            loss.backward()
            opt.step()
            steps += 1
            if epoch == 0 and steps == 1:
                first_step = time.time()
        if a.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if rank == 0:
            row = {"epoch": epoch + 1, "steps": steps, "seconds": seconds,
                   "samples_per_s": steps * a.batch_size * size / seconds}
            if epoch == 0:
                row["first_step_unix_s"] = first_step
        if a.test_data:  # each rank scores a contiguous slice, eval mode, sums all-reduced
            tx, ty = load(a.test_data)
            n = tx.shape[0]
            lo, hi = n * rank // size, n * (rank + 1) // size
            model.eval()
            with torch.no_grad():
                correct = sum((model(tx[i:min(i + 1000, hi)].to(device)).argmax(1).cpu() == ty[i:min(i + 1000, hi)])
                              .sum().item() for i in range(lo, hi, 1000))
            model.train()
            t = torch.tensor([float(correct)], device=device)
            dist.all_reduce(t)
            if rank == 0:
                row["test_accuracy"] = t.item() / n
        if rank == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
