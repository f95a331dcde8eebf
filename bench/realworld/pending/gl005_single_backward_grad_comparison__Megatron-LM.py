"""Correct: not a training loop: gradients are cleared once before one backward, to compare two modules.

Reduced from NVIDIA/Megatron-LM tests/unit_tests/transformer/experimental_attention_variant/test_absorbed_mla.py.
There is no optimizer and no second step: each module's grads are zeroed, one backward runs with the
same upstream gradient, and the resulting grads are compared. Nothing is kept between steps.
"""

import torch


def compare_grads(absorbed_mla, standard_mla, hidden_states):
    grads = torch.randn_like(hidden_states)

    for name, param in absorbed_mla.named_parameters():
        if param.grad is not None:
            param.grad.zero_()
    absorbed_outputs, _ = absorbed_mla(hidden_states, attention_mask=None)
    absorbed_outputs.backward(grads)

    for name, param in standard_mla.named_parameters():
        if param.grad is not None:
            param.grad.zero_()
    standard_outputs, _ = standard_mla(hidden_states, attention_mask=None)
    standard_outputs.backward(grads)

    for (name, p1), (_, p2) in zip(absorbed_mla.named_parameters(), standard_mla.named_parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, msg=name)
