"""Correct: an optimizer's own zero_grad, where zeroing in place is the branch its caller asked for.

Reduced from NVIDIA/apex apex/contrib/optimizers/fp16_optimizer.py (FP16_Optimizer.zero_grad); the
same shape is in apex/contrib/optimizers/distributed_fused_adam.py (zero_grad(set_to_none)) and
microsoft/DeepSpeedExamples training/DeepSpeed-Domino/domino/optimizer/optimizer.py
(_zero_grad_group_helper, copied from torch.optim). The method implements both behaviours and
defaults to freeing; `p.grad.zero_()` runs only when the caller passes False.
"""

import torch


class FP16_Optimizer:
    def __init__(self, init_optimizer, loss_scale=2.0**16):
        self.optimizer = init_optimizer
        self.fp16_groups = [group["params"] for group in init_optimizer.param_groups]
        self.fp32_groups = [[p.detach().float() for p in group] for group in self.fp16_groups]
        self.cur_scale = loss_scale

    def zero_grad(self, set_grads_to_None=True):
        """Zero FP16 parameter grads."""
        # For speed, set model fp16 grad to None by default
        for group in self.fp16_groups:
            for p in group:
                if set_grads_to_None:
                    p.grad = None
                else:
                    if p.grad is not None:
                        p.grad.detach_()
                        p.grad.zero_()

    def backward(self, loss):
        (loss.float() * self.cur_scale).backward()

    def step(self):
        for fp16_group, fp32_group in zip(self.fp16_groups, self.fp32_groups):
            for p16, p32 in zip(fp16_group, fp32_group):
                p32.grad = p16.grad.float() / self.cur_scale
        self.optimizer.step()
