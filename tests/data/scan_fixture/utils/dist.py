import os

import torch
import torch.distributed as dist
from torch.distributed import Backend


def setup(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    backend = Backend.NCCL if dist.is_nccl_available() else "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return torch.device("cuda", rank)
