"""grad_state reads gradients smallest first and small ones as Python lists: the answer must not depend on either."""

import torch

from gradlint.runtime.tracer import grad_state


def _param(numel: int, grad: torch.Tensor | None) -> torch.Tensor:
    p = torch.zeros(numel, requires_grad=True)
    p.grad = grad
    return p


def test_no_gradient_allocated_is_none() -> None:
    assert grad_state([_param(10, None), _param(1000, None)]) == "none"


def test_allocated_zero_gradients_are_zero_including_negative_zero() -> None:
    assert grad_state([_param(10, torch.full((10,), -0.0)), _param(1000, torch.zeros(1000)), _param(3, None)]) == "zero"


def test_one_value_in_the_large_gradient_makes_it_dirty() -> None:
    big = torch.zeros(1000)
    big[999] = 1e-30
    assert grad_state([_param(1000, big), _param(10, torch.zeros(10))]) == "dirty"


def test_one_value_in_a_small_gradient_makes_it_dirty() -> None:
    small = torch.zeros(10)
    small[4] = -3.0
    assert grad_state([_param(1000, torch.zeros(1000)), _param(10, small)]) == "dirty"


def test_nan_and_a_multi_dimensional_small_gradient_are_dirty() -> None:
    nan = torch.zeros(2, 3)
    nan[1, 2] = float("nan")
    p = torch.zeros(2, 3, requires_grad=True)
    p.grad = nan
    assert grad_state([p]) == "dirty"


def test_sparse_gradients_are_read_through_their_values() -> None:
    dense = torch.zeros(5, 4, requires_grad=True)
    dense.grad = torch.sparse_coo_tensor([[1]], torch.zeros(1, 4), (5, 4))
    assert grad_state([dense]) == "zero"
    dense.grad = torch.sparse_coo_tensor([[1]], torch.ones(1, 4), (5, 4))
    assert grad_state([dense]) == "dirty"


def test_a_low_precision_gradient_is_read_exactly() -> None:
    half = torch.zeros(8, dtype=torch.bfloat16)
    half[0] = 1e-38
    p = torch.zeros(8, dtype=torch.bfloat16, requires_grad=True)
    p.grad = half
    assert grad_state([p]) == "dirty"
