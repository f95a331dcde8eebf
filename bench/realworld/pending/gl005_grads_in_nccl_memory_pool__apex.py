"""Correct: gradients are allocated in an NCCL memory pool and must stay there across steps.

Reduced from NVIDIA/apex apex/contrib/examples/nccl_allocator/toy_ddp.py. Every `param.grad` is
created with `torch.empty_like` inside `nccl_allocator.nccl_mem(pool)`; `zero_grad(set_to_none=False)`
keeps those tensors, and the script checks afterwards that their data pointers did not change.
"""

import os

import apex.contrib.nccl_allocator as nccl_allocator
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

rank = int(os.getenv("RANK"))
nccl_allocator.init()
dist.init_process_group(backend="nccl")
model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)).to(rank)
ddp_model = DDP(model, device_ids=[rank])
loss_fn = nn.MSELoss()
optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

data_ptrs = []
pool = nccl_allocator.create_nccl_mem_pool()
with nccl_allocator.nccl_mem(pool):
    for param in ddp_model.parameters():
        param.grad = torch.empty_like(param)
        data_ptrs.append(param.grad.data_ptr())

for _ in range(10):
    optimizer.zero_grad(set_to_none=False)
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(rank)
    loss_fn(outputs, labels).backward()
    optimizer.step()

for data_ptr, param in zip(data_ptrs, ddp_model.parameters()):
    assert param.grad.data_ptr() == data_ptr
