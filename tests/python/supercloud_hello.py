"""A hello world in the shape of MIT SuperCloud's DDP example (torch_test.py run by
`mpirun python torch_test.py` from batch.sh): get_dist_env() reads the rank and size from MPI's or
Slurm's variables, init_process_group() reads MASTER_ADDR/MASTER_PORT, run() prints where each
rank is. Its batch.sh exported MASTER_ADDR and a free port by hand; under `mpiddp launch` it runs
as it is. The backend is gloo here (the example's nccl needs GPUs)."""
import os
import socket

import torch
import torch.distributed as dist


def run(rank, size, hostname):
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    print(f"{hostname}: {rank} of {size}, all_reduce {t.item():.0f}", flush=True)


def get_dist_env():
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        world_size = int(os.getenv("OMPI_COMM_WORLD_SIZE"))
    else:
        world_size = int(os.getenv("SLURM_NTASKS"))
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        global_rank = int(os.getenv("OMPI_COMM_WORLD_RANK"))
    else:
        global_rank = int(os.getenv("SLURM_PROCID"))
    return global_rank, world_size


if __name__ == "__main__":
    global_rank, world_size = get_dist_env()
    hostname = socket.gethostname()
    dist.init_process_group(backend="gloo", rank=global_rank, world_size=world_size)
    run(global_rank, world_size, hostname)
    dist.destroy_process_group()
