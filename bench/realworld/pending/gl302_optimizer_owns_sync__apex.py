"""Correct: only the reference model is DDP; the other model's gradient sync belongs to the optimizer.

Reduced from NVIDIA/apex apex/contrib/test/optimizers/test_dist_adam.py. `dist_model` is a plain
module; DistributedFusedAdam registers its own gradient hooks and reduce-scatters, and its
`no_sync` context (chosen into `backward_context`) is used on every micro-batch but the last.
The DDP wrapper is around `ref_model` only, built in `make_models`.
"""

from contextlib import nullcontext

import torch
from apex.contrib.optimizers.distributed_fused_adam import DistributedFusedAdam


def make_models(model_factory, rank):
    ref_model = torch.nn.parallel.DistributedDataParallel(model_factory(), device_ids=[rank])
    dist_model = model_factory()
    return ref_model, dist_model


def train(dist_model, micro_batches_per_step, num_steps, make_batch, loss_fn):
    dist_optim = DistributedFusedAdam(dist_model.parameters(), lr=0.1, overlap_grad_sync=True)
    for step in range(num_steps):
        dist_optim.zero_grad()
        for micro_step in range(micro_batches_per_step):
            x, target = make_batch()
            loss = loss_fn(dist_model(x), target) / micro_batches_per_step
            backward_context = nullcontext
            if micro_step < micro_batches_per_step - 1:
                backward_context = dist_optim.no_sync
            with backward_context():
                loss.backward()
        dist_optim.step()
