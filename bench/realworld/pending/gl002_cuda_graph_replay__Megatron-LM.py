"""Correct: the forward and backward are captured in a CUDA graph; each replay runs them after the clear.

Reduced from NVIDIA/Megatron-LM tests/unit_tests/distributed/mfsdp_v1/test_mfsdp_fully_shard.py.
`run_step()` (forward + `loss.backward()`) is captured once; in the loop `graph.replay()` runs that
backward again after `optimizer.zero_grad(set_to_none=False)`, and the buffers must stay allocated
so the replayed backward writes into the tensors the optimizer reads.
"""

import torch
from torch.nn.functional import mse_loss


def train(model, optimizer, static_input, static_target, num_replays=8):
    def run_step():
        output = model(static_input)
        loss = mse_loss(output, static_target)
        loss.backward()
        return loss

    warmup_stream = torch.cuda.Stream()
    warmup_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup_stream):
        for _ in range(3):
            # set_to_none=False keeps param.grad at the address the captured backward writes to
            optimizer.zero_grad(set_to_none=False)
            run_step()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(warmup_stream)

    optimizer.zero_grad(set_to_none=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = run_step()

    losses = []
    for step in range(num_replays):
        optimizer.zero_grad(set_to_none=False)
        graph.replay()
        losses.append(static_loss.detach().clone())
        optimizer.step()
    return losses
