"""Correct: not a training loop: a unit test checks that a wrapper forwards set_to_none to zero_grad.

Reduced from Lightning-AI/pytorch-lightning tests/tests_fabric/test_wrappers.py
(test_fabric_optimizer_zero_grad_kwargs). The wrapped optimizer's zero_grad is mocked; the calls
exist to assert which arguments reach it.
"""

from unittest import mock
from unittest.mock import Mock

import torch
from lightning.fabric.wrappers import _FabricOptimizer


def test_fabric_optimizer_zero_grad_kwargs():
    with mock.patch("torch.optim.SGD.zero_grad") as zero_grad_mock:
        optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), 0.1)
        fabric_optimizer = _FabricOptimizer(optimizer=optimizer, strategy=Mock())
        fabric_optimizer.zero_grad()
        zero_grad_mock.assert_called_with()
        fabric_optimizer.zero_grad(set_to_none=False)
        zero_grad_mock.assert_called_with(set_to_none=False)
        fabric_optimizer.zero_grad(set_to_none=True)
        zero_grad_mock.assert_called_with(set_to_none=True)
