"""Buggy: a gradient-accumulation test clears the fp32 accumulation buffer on every micro-batch.

Reduced from huggingface/nanotron tests/test_optimizer_params_groups.py (five tests, accumulation_steps
1 and 10). OptimizerFromGradientAccumulator.zero_grad calls FP32GradientAccumulator.zero_grad, which
zeroes the contiguous fp32 buffer, so only the last micro-batch reaches the step and the test never
exercises accumulation. Only GL003 is a real finding here: nothing accumulates, so the loss needs no
division (no GL004), and this function has no DDP model (the file's DDP test is another function,
so no GL302).
"""

import torch
import torch.nn.functional as F
from nanotron.optim.gradient_accumulator import FP32GradientAccumulator
from nanotron.optim.named_optimizer import NamedOptimizer
from nanotron.optim.optimizer_from_gradient_accumulator import OptimizerFromGradientAccumulator
from torch import optim


def test_optimizer_grad_accumulation(model, accumulation_steps=10, lr=0.1):
    optimizer = OptimizerFromGradientAccumulator(
        gradient_accumulator_builder=lambda named_params: FP32GradientAccumulator(named_parameters=named_params),
        named_params_or_groups=[{"named_params": list(model.named_parameters()), "lr": lr}],
        optimizer_builder=lambda groups: NamedOptimizer(groups, lambda param_groups: optim.SGD(param_groups, lr=lr)),
    )
    accumulator = optimizer.gradient_accumulator
    input = torch.randn(10, 10).to(device="cuda")
    target = torch.randint(0, 2, (10,)).to(device="cuda")
    for batch_idx in range(100):
        optimizer.zero_grad()  # expect: GL003
        output = model(input)
        loss = F.cross_entropy(output.float(), target)
        accumulator.backward(loss)
        if (batch_idx + 1) % accumulation_steps == 0:
            with torch.no_grad():
                expected = model.fc1.weight - lr * accumulator.get_grad_buffer(name="fc1.weight")
            optimizer.step()
            torch.testing.assert_close(expected, model.fc1.weight)


def _test_ddp_optimizer_grad_accumulation(model, parallel_context):
    model_ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=parallel_context.dp_pg)
    return model_ddp
