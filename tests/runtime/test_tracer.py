"""The tracer records the right events and leaves training and torch untouched."""

from __future__ import annotations

import torch
from torch import nn

from gradlint.events import EventKind
from gradlint.runtime.tracer import StopTraining, Tracer, loss_factor
from torch_state import torch_patch_points, train_everything


def test_tracing_leaves_parameters_bitwise_equal():
    plain = train_everything()
    with Tracer() as tracer:
        traced = train_everything()
    assert len(plain) == len(traced)
    for a, b in zip(plain, traced):
        assert torch.equal(a, b)
    kinds = {e.kind for e in tracer.events}
    assert kinds == set(EventKind)


def test_every_patch_is_restored_and_torch_behaves_as_before():
    before_state = torch_patch_points()
    before = train_everything()
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before tracing: watched, then released
    with Tracer():
        during_state = torch_patch_points()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
    assert during_state != before_state
    assert torch_patch_points() == before_state
    assert not model.weight._post_accumulate_grad_hooks
    after = train_everything()
    for a, b in zip(before, after):
        assert torch.equal(a, b)


def test_restored_even_when_the_loop_is_stopped():
    before_state = torch_patch_points()
    tracer = Tracer(max_steps=2)
    steps = 0
    try:
        with tracer:
            model = nn.Linear(3, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(10):
                opt.zero_grad()
                model(torch.randn(2, 3)).sum().backward()
                opt.step()
                steps += 1
    except StopTraining:
        pass
    assert steps == 2 and tracer.steps == 2
    assert torch_patch_points() == before_state


def test_facts_stale_gradients_and_touched_optimizers():
    with Tracer() as tracer:
        torch.manual_seed(0)
        gen, disc = nn.Linear(2, 2), nn.Linear(2, 1)
        og = torch.optim.SGD(gen.parameters(), lr=0.1)
        od = torch.optim.SGD(disc.parameters(), lr=0.1)
        x = torch.randn(4, 2)
        disc(x).sum().backward()  # reaches only the discriminator
        od.step()
        disc(gen(x)).sum().backward()  # reaches both; disc grads are stale
        og.step()
    backwards = [e for e in tracer.events if e.kind is EventKind.BACKWARD]
    # labels follow first appearance: the discriminator's optimizer is SGD#0
    assert backwards[0].facts["touched"] == ["SGD#0"]
    assert backwards[1].facts["touched"] == ["SGD#0", "SGD#1"]
    assert backwards[1].facts["before"] == {"SGD#0": "dirty", "SGD#1": "none"}
    steps = [e for e in tracer.events if e.kind is EventKind.STEP]
    assert [s.target for s in steps] == ["SGD#0", "SGD#1"]
    assert all(s.site.path == __file__ for s in tracer.events)


def test_zero_grad_set_to_none_is_read_from_the_call():
    with Tracer() as tracer:
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad()
        opt.zero_grad(False)
        opt.zero_grad(set_to_none=False)
        model.zero_grad(set_to_none=True)
    zeros = [e for e in tracer.events if e.kind is EventKind.ZERO]
    assert [z.facts["set_to_none"] for z in zeros] == [True, False, False, True]
    assert zeros[3].facts["via"] == "module" and zeros[3].facts["targets"] == ["SGD#0"]


def test_loss_factor_reads_the_constant_at_the_root():
    x = torch.randn(5, requires_grad=True)
    loss = x.pow(2).mean()
    assert loss_factor(loss) == 1.0
    assert loss_factor(loss / 4) == 0.25
    assert loss_factor(loss * 0.125) == 0.125
    assert loss_factor(0.5 * loss) == 0.5
    assert loss_factor(loss / torch.tensor(8.0)) == 0.125
    l2 = loss.clone()
    l2 /= 2
    assert loss_factor(l2) == 0.5
    assert loss_factor(loss * x.sum()) == 1.0  # not a constant
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    assert loss_factor(scaler.scale(loss / 4), skip_first_scale=True) == 0.25


def test_clipping_is_recorded_however_it_was_imported():
    from torch.nn.utils import clip_grad_norm_  # bound before tracing, as at the top of a script
    from torch.nn.utils.clip_grad import clip_grad_value_

    model = nn.Linear(3, 1)
    with Tracer() as tracer:
        model(torch.randn(2, 3)).sum().backward()
        clip_grad_norm_(model.parameters(), 1.0)  # calls get_total_norm and clip_grads_with_norm_ inside
        clip_grad_value_(model.parameters(), 0.1)
        torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    clips = [e.facts["fn"] for e in tracer.events if e.kind is EventKind.CLIP]
    assert clips == ["clip_grad_norm_", "clip_grad_value_", "get_total_norm"]
