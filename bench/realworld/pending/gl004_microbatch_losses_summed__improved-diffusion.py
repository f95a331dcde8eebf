"""Buggy: a batch is split into micro-batches whose mean losses are summed, never divided by their number.

Reduced from openai/improved-diffusion improved_diffusion/train_util.py (TrainLoop.forward_backward).
With `microbatch < batch_size` the gradient is (batch_size / microbatch) times the batch gradient;
the grad-norm log and the fp16 overflow check see it too (AdamW hides most of the update size).
NVIDIA/Megatron-LM tests/unit_tests/distributed/mfsdp_v1/test_mcore_fully_sharded_data_parallel.py has
the same shape (4 micro-batches of out.sum(), no division) in a smoke test.
"""

import torch
from torch.optim import AdamW


class TrainLoop:
    def __init__(self, model, diffusion, batch_size, microbatch, lr):
        self.model = model
        self.diffusion = diffusion
        self.microbatch = microbatch if microbatch > 0 else batch_size
        self.opt = AdamW(self.model.parameters(), lr=lr)

    def forward_backward(self, batch, cond):
        self.opt.zero_grad()
        for i in range(0, batch.shape[0], self.microbatch):
            micro = batch[i : i + self.microbatch]
            micro_cond = {k: v[i : i + self.microbatch] for k, v in cond.items()}
            t = torch.randint(0, self.diffusion.num_timesteps, (micro.shape[0],))
            losses = self.diffusion.training_losses(self.model, micro, t, model_kwargs=micro_cond)
            loss = losses["loss"].mean()
            loss.backward()  # expect: GL004

    def run_step(self, batch, cond):
        self.forward_backward(batch, cond)
        self.opt.step()

    def run_loop(self, data):
        for batch, cond in data:
            self.run_step(batch, cond)
