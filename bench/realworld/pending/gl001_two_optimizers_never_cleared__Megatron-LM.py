"""Buggy: an optimizer under test and its reference both step on gradients that are never cleared.

Reduced from NVIDIA/Megatron-LM tests/unit_tests/test_optimizer_cpu_offloading.py. HybridDeviceOptimizer.step
(megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py) does not clear `.grad`, and neither does
the reference torch optimizer: both accumulate every earlier gradient. The comparison still passes
because both sides share the defect. facebookresearch/fairseq tests/distributed/test_bmuf.py has the
same defect through a train_step helper (FairseqBMUF.step only delegates to SGD.step).
"""

import torch
from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer


def test_multi_device_hybrid_optimizer(net1, net2, n_steps=10):
    hdo = HybridDeviceOptimizer(list(net1.parameters()), offload_fraction=0.5, lr=0.1)
    ref_optimizer = torch.optim.Adam(net2.parameters(), lr=0.1)
    for _ in range(1, n_steps):
        input = torch.randn(1, 3, 32, 32).cuda()
        output = net1(input)
        output.sum().backward()
        hdo.step()  # expect: GL001
        output = net2(input)
        output.sum().backward()
        ref_optimizer.step()  # expect: GL001
    for p1, p2 in zip(net1.parameters(), net2.parameters()):
        torch.testing.assert_close(p1, p2)
