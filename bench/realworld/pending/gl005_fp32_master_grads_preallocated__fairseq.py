"""Correct: fp32 master gradients are allocated once and refilled with copy_, so zero_grad keeps them.

Reduced from facebookresearch/fairseq fairseq/optim/fp16_optimizer.py (_FP16OptimizerMixin). The
fp16 model grads are freed (`p.grad = None`); the fp32 master grads are created in
`build_fp32_params` and written by `copy_` in `_sync_fp16_grads_to_fp32`, so they must stay allocated.
"""

import torch


class FP16Optimizer:
    def __init__(self, params, fp32_optimizer_cls):
        self.fp16_params = list(params)
        self.fp32_params = []
        for p in self.fp16_params:
            p32 = torch.nn.Parameter(p.data.float())
            p32.grad = torch.zeros_like(p32.data)
            self.fp32_params.append(p32)
        self.fp32_optimizer = fp32_optimizer_cls(self.fp32_params)

    def backward(self, loss):
        loss.backward()

    def _sync_fp16_grads_to_fp32(self):
        for p, p32 in zip(self.fp16_params, self.fp32_params):
            if p.grad is not None:
                p32.grad.data.copy_(p.grad.data)
            else:
                p32.grad = torch.zeros_like(p.data, dtype=torch.float)

    def step(self):
        self._sync_fp16_grads_to_fp32()
        self.fp32_optimizer.step()
        for p, p32 in zip(self.fp16_params, self.fp32_params):
            p.data.copy_(p32.data)

    def zero_grad(self):
        """Clears the gradients of all optimized parameters."""
        for p in self.fp16_params:
            p.grad = None
        for p32 in self.fp32_params:
            if p32.grad is not None:
                p32.grad.zero_()
