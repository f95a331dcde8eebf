"""Correct: the fp16 path flattens every model gradient, so they must stay tensors, not None.

Reduced from openai/improved-diffusion improved_diffusion/fp16_util.py and train_util.py.
`model_grads_to_master_grads` builds the flat master gradient from `param.grad.data` of every model
parameter; a gradient set to None (a parameter unused in one step) would crash it, so the helper
zeroes in place. (Its successor guided-diffusion added `param_grad_or_zeros` and could free them.)
"""

import torch
from torch._utils import _flatten_dense_tensors


def zero_grad(model_params):
    for param in model_params:
        # Taken from https://pytorch.org/docs/stable/_modules/torch/optim/optimizer.html#Optimizer.add_param_group
        if param.grad is not None:
            param.grad.detach_()
            param.grad.zero_()


def model_grads_to_master_grads(model_params, master_params):
    master_params[0].grad = _flatten_dense_tensors([param.grad.data.detach().float() for param in model_params])


def run_loop(model, diffusion, data, opt, master_params, lg_loss_scale=20.0):
    model_params = list(model.parameters())
    for batch, cond in data:
        zero_grad(model_params)
        loss = diffusion.training_losses(model, batch, cond)["loss"].mean()
        (loss * 2**lg_loss_scale).backward()
        model_grads_to_master_grads(model_params, master_params)
        master_params[0].grad.mul_(1.0 / 2**lg_loss_scale)
        opt.step()
