"""Correct: distributed autograd keeps each iteration's gradients in its own context.

Reduced from pytorch/examples distributed/rpc/rnn/main.py (same loop in distributed/rpc/ddp_rpc/main.py
and distributed/rpc/parameter_server/rpc_parameter_server.py). `dist_autograd.backward(context_id, ...)`
writes gradients into the context, not into `.grad`, and `DistributedOptimizer.step(context_id)`
reads them from there; a new context per iteration starts from zero, so there is nothing to clear.
"""

import torch
import torch.distributed.autograd as dist_autograd
import torch.optim as optim
from torch.distributed.optim import DistributedOptimizer


def run_trainer(model, get_next_batch):
    criterion = torch.nn.CrossEntropyLoss()
    opt = DistributedOptimizer(optim.SGD, model.parameter_rrefs(), lr=0.05)
    for epoch in range(10):
        for data, target in get_next_batch():
            with dist_autograd.context() as context_id:
                output = model(data)
                loss = criterion(output, target)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
                # not necessary to zero grads as each iteration creates a different
                # distributed autograd context which hosts different grads
