"""Buggy (memory, test code): a hand-written SGD loop zeroes every .grad in place instead of freeing it.

Reduced from NVIDIA/Megatron-LM tests/unit_tests/generalized_tensor_parallel/test_attention_gtp.py
(same loop in test_gtp_loss_correctness.py, test_mamba_gtp.py and test_moe_egtp.py). Nothing reads
the zeroed buffers before the next backward; `p.grad = None` would free them. Low stakes in a test.
"""

import torch

LR = 1e-3


def train(layers, run_step, steps, seq, batch, hidden):
    losses = []
    for step in range(steps):
        torch.manual_seed(step)
        x = torch.randn(seq, batch, hidden, device="cuda")
        loss = run_step(layers, x)
        losses.append(loss.item())
        loss.backward()
        with torch.no_grad():
            for p in layers.parameters():
                if p.grad is not None:
                    p.data.sub_(LR * p.grad)
                    p.grad.zero_()  # expect: GL005
    return losses
