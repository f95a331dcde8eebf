"""Which optimizers a backward reaches, asked once per backward from its root node.

The tracer keeps each parameter's AccumulateGrad node and asks the engine, at
the start of the graph, which of them will run. Each test below changes what
the graph or the parameters look like between backwards and checks the
``touched`` fact against what the backward really accumulated into.
"""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

from gradlint.events import EventKind
from gradlint.runtime.tracer import Tracer


def _touched(tracer: Tracer) -> list[list[str]]:
    return [e.facts["touched"] for e in tracer.events if e.kind is EventKind.BACKWARD]


def test_a_parameter_given_a_new_dtype_after_its_node_was_read_is_still_seen():
    # p.data with another dtype makes torch drop the parameter's AccumulateGrad
    # node: the node read at the first backward is no longer in later graphs.
    with Tracer() as tracer:
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 3)).sum().backward()
        opt.zero_grad()
        model.double()
        model(torch.randn(2, 3, dtype=torch.float64)).sum().backward()
    assert _touched(tracer) == [["SGD#0"], ["SGD#0"]]
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float64


def test_a_parameter_unfrozen_after_its_node_was_read_is_seen():
    with Tracer() as tracer:
        frozen = nn.Parameter(torch.ones(3), requires_grad=False)
        other = nn.Parameter(torch.ones(3))
        opt_frozen = torch.optim.SGD([frozen], lr=0.1)
        opt_other = torch.optim.SGD([other], lr=0.1)
        (frozen * other).sum().backward()  # reaches only `other`
        opt_other.step()
        frozen.requires_grad_(True)
        (frozen * other).sum().backward()  # reaches both
        opt_frozen.step()
    assert _touched(tracer) == [["SGD#0"], ["SGD#0", "SGD#1"]]


def test_backward_with_inputs_reaches_only_their_optimizers():
    with Tracer() as tracer:
        a, b = nn.Linear(2, 2), nn.Linear(2, 1)
        opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
        opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
        b(a(torch.randn(4, 2))).sum().backward(inputs=list(b.parameters()))
        opt_b.step()
        opt_a.step()
    assert _touched(tracer) == [["SGD#0"]]
    steps = [e for e in tracer.events if e.kind is EventKind.STEP]
    assert [(s.target, s.facts["grads"]) for s in steps] == [("SGD#0", "dirty"), ("SGD#1", "none")]
    assert all(p.grad is None for p in a.parameters())


def test_several_roots_and_a_leaf_root():
    with Tracer() as tracer:
        a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
        opt_a, opt_b = torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)
        torch.autograd.backward([(a * 2).sum(), (b * 3).sum()])
        opt_a.step()
        torch.autograd.backward(b, grad_tensors=torch.ones(2))  # the root is the parameter itself
        opt_b.step()
    assert _touched(tracer) == [["SGD#0", "SGD#1"], ["SGD#1"]]
    assert torch.equal(b.grad, torch.full((2,), 4.0))


def test_a_parameter_that_receives_no_gradient_counts_as_reached_as_a_gradient_hook_would():
    # The engine runs the AccumulateGrad node of every leaf in the graph, with an
    # undefined gradient where the function returned None; a gradient hook on the
    # parameter runs then too, and that is what "touched" has always meant.
    class NoGradForSecond(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):  # type: ignore[override]
            return x * 2 + y.detach()

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            return grad * 2, None

    with Tracer() as tracer:
        x, y = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
        opt_x, opt_y = torch.optim.SGD([x], lr=0.1), torch.optim.SGD([y], lr=0.1)
        NoGradForSecond.apply(x, y).sum().backward()
        opt_x.step()
        opt_y.step()
    assert _touched(tracer) == [["SGD#0", "SGD#1"]]
    assert y.grad is None


def test_a_group_list_edited_in_place_is_read_again():
    with Tracer() as tracer:
        p = nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=0.1)
        (p * 2).sum().backward()
        opt.step()
        q = nn.Parameter(torch.ones(2))
        q.grad = torch.zeros(2)
        opt.param_groups[0]["params"][0] = q  # same list, same length: only the identity changed
        opt.step()
    steps = [e.facts["grads"] for e in tracer.events if e.kind is EventKind.STEP]
    assert steps == ["dirty", "zero"]


def test_a_retained_graph_is_seen_at_each_backward_and_still_works_after_tracing():
    x = nn.Parameter(torch.ones(2))
    with Tracer() as tracer:
        opt = torch.optim.SGD([x], lr=0.1)
        loss = (x * 3).sum()
        loss.backward(retain_graph=True)
        loss.backward(retain_graph=True)
        opt.step()
    assert _touched(tracer) == [["SGD#0"], ["SGD#0"]]
    events = len(tracer.events)
    loss.backward()  # after the tracer, through the root that carried its hook
    assert len(tracer.events) == events
    assert torch.equal(x.grad, torch.full((2,), 9.0))


def test_an_optimizer_dropped_during_tracing_does_not_keep_its_parameters_alive():
    with Tracer() as tracer:
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
        weight = weakref.ref(model.weight)
        del model, opt
        gc.collect()
        assert weight() is None
    assert _touched(tracer) == [["SGD#0"]]


def test_parameters_reached_only_by_a_backward_inside_the_backward_are_seen():
    # Reentrant checkpointing keeps the block's parameters out of the outer graph:
    # they get their gradients from a second backward run while the first one runs.
    from torch.utils.checkpoint import checkpoint

    with Tracer() as tracer:
        block, head = nn.Linear(3, 3), nn.Linear(3, 1)
        opt_block = torch.optim.SGD(block.parameters(), lr=0.1)
        opt_head = torch.optim.SGD(head.parameters(), lr=0.1)
        x = torch.randn(2, 3, requires_grad=True)
        head(checkpoint(block, x, use_reentrant=True)).sum().backward()
        opt_head.step()
        opt_block.step()
    assert _touched(tracer) == [["SGD#0", "SGD#1"]]
    assert [e.kind for e in tracer.events] == [EventKind.BACKWARD, EventKind.STEP, EventKind.STEP]
    assert block.weight.grad is not None
