"""Correct: an equivalence test backpropagates synthetic upstream gradients; the sum is the point.

Reduced from NVIDIA/apex apex/contrib/test/optimizers/test_dist_adam.py (test_matches_pytorch).
`y.backward(dy)` feeds a random upstream gradient per micro-batch; there is no mean loss to divide.
The DDP reference and the ZeRO optimizer both step on the summed gradient and their results are
compared, so dividing would change nothing the test checks.
"""

import torch
from apex.contrib.optimizers.distributed_fused_adam import DistributedFusedAdam


def run(ref_model, dist_model, num_steps, micro_batch_steps, batch_size, layer_size, device):
    ref_optim = torch.optim.AdamW(ref_model.parameters(), lr=0.1)
    dist_optim = DistributedFusedAdam(dist_model.parameters(), lr=0.1)
    for step in range(num_steps):
        xs = [torch.rand(batch_size, layer_size, device=device) - 0.5 for _ in range(micro_batch_steps)]
        dys = [torch.rand_like(x) - 0.5 for x in xs]

        ref_optim.zero_grad()
        for micro_step in range(micro_batch_steps):
            y_ref = ref_model(xs[micro_step].detach().clone().requires_grad_(True))
            y_ref.backward(dys[micro_step])
        ref_optim.step()

        dist_optim.zero_grad()
        for micro_step in range(micro_batch_steps):
            y_dist = dist_model(xs[micro_step].detach().clone().requires_grad_(True))
            y_dist.backward(dys[micro_step])
        dist_optim.step()
        for ref_param, dist_param in zip(ref_model.parameters(), dist_model.parameters()):
            torch.testing.assert_close(dist_param, ref_param)
