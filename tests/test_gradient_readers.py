"""Which functions of another file read the gradients of a model they are handed (GL107's cross-file reads)."""

from __future__ import annotations

import ast
import textwrap

import pytest

from gradlint.scaler_release_facts import reads_handed_gradients


def _function(source: str) -> ast.FunctionDef:
    return ast.parse(textwrap.dedent(source)).body[0]


@pytest.mark.parametrize("source", [
    """
    def check_gradient_explosion(model, max_grad_norm=100.0):
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        return grad_norm.item() > max_grad_norm
    """,
    """
    def log_gradient_stats(model, prefix, log):
        for name, p in model.named_parameters():
            if not hasattr(p.grad, "data"):
                continue
            log_stats(p.grad.data.detach(), f"{prefix}/{name}", log)
    """,
    """
    def grad_norm(model):
        return torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()
    """,
    """
    def collect_host_gradients_async(host_parameters, device):
        host_grads = [p.grad for p in host_parameters if p.grad is not None]
        return torch.stack(torch._foreach_norm(host_grads, ord=2)).pow(2).sum()
    """,
])
def test_a_function_reading_the_handed_model_s_gradient_values_is_a_reader(source):
    assert reads_handed_gradients(_function(source))


@pytest.mark.parametrize("source", [
    """
    def all_finite(model):
        return all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    """,
    """
    def clip(model, max_norm):
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    """,
    """
    def scale_down(model, n):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(n)
    """,
    """
    def unscale_and_log(model, scaler, opt):
        scaler.unscale_(opt)
        return [p.grad.norm() for p in model.parameters()]
    """,
    """
    def log_norms(params):
        return [p.grad.norm() for p in self.model.parameters()]
    """,
    """
    def any_missing(parameters):
        return any(p.grad is None for p in parameters)
    """,
])
def test_finiteness_checks_clips_writers_unscalers_and_unhanded_models_are_no_readers(source):
    assert not reads_handed_gradients(_function(source))
