"""Buggy (memory): a zero_grad helper zeroes model gradients in place though nothing needs the buffers.

Reduced from openai/guided-diffusion guided_diffusion/fp16_util.py (zero_grad, MixedPrecisionTrainer).
The master gradients are built through `param_grad_or_zeros`, which accepts a None gradient, so
`param.grad = None` would free the model gradients between steps at no cost.
"""

import torch as th


def zero_grad(model_params):
    for param in model_params:
        if param.grad is not None:
            param.grad.detach_()
            param.grad.zero_()  # expect: GL005


def param_grad_or_zeros(param):
    if param.grad is not None:
        return param.grad.data.detach()
    return th.zeros_like(param)


class MixedPrecisionTrainer:
    def __init__(self, model, lr):
        self.model_params = list(model.parameters())
        self.master_params = [p.detach().clone().float().requires_grad_(True) for p in self.model_params]
        self.opt = th.optim.AdamW(self.master_params, lr=lr)

    def run_step(self, model, batch):
        zero_grad(self.model_params)
        (model(batch).mean() * 2**20).backward()
        for master, param in zip(self.master_params, self.model_params):
            master.grad = param_grad_or_zeros(param).float() / 2**20
        self.opt.step()
