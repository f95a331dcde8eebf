"""The tracer records the right events and leaves training and torch untouched."""

from __future__ import annotations

import torch
from torch import nn

from gradlint.events import EventKind
from gradlint.runtime.tracer import StopTraining, Tracer, loss_factor


def _train(steps=6, accum=2, use_scaler=True):
    """A loop that touches every traced entry point: clear, scaled backward, unscale, clip, step, update, schedule."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt2 = torch.optim.AdamW(model[2].parameters(), lr=1e-3, foreach=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)
    data = torch.randn(steps * accum, 4, 6)
    for i in range(steps * accum):
        loss = model(data[i]).pow(2).mean() / accum
        scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
            opt2.step()
            sched.step()
            opt.zero_grad(set_to_none=(i % 4 == 1))
            model.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_tracing_leaves_parameters_bitwise_equal():
    plain = _train()
    with Tracer() as tracer:
        traced = _train()
    assert len(plain) == len(traced)
    for a, b in zip(plain, traced):
        assert torch.equal(a, b)
    kinds = {e.kind for e in tracer.events}
    assert kinds == set(EventKind)


def _snapshot():
    from torch.amp.grad_scaler import GradScaler
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.utils import clip_grad
    from torch.optim import lr_scheduler, optimizer

    return {
        "Tensor.backward": torch.Tensor.__dict__["backward"],
        "autograd.backward": torch.autograd.backward,
        "Optimizer.zero_grad": optimizer.Optimizer.__dict__["zero_grad"],
        "Optimizer.__init__": optimizer.Optimizer.__dict__["__init__"],
        "Module.zero_grad": nn.Module.__dict__["zero_grad"],
        "clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
        "clip_grad.clip_grad_norm_": clip_grad.clip_grad_norm_,
        "clip_grad_value_": torch.nn.utils.clip_grad_value_,
        "GradScaler": {k: GradScaler.__dict__[k] for k in ("scale", "unscale_", "step", "update")},
        "LRScheduler.step": lr_scheduler.LRScheduler.__dict__["step"],
        "ReduceLROnPlateau.step": lr_scheduler.ReduceLROnPlateau.__dict__["step"],
        "DDP": (DDP.__dict__["forward"], DDP.__dict__["register_comm_hook"]),
        "pre_hooks": dict(optimizer._global_optimizer_pre_hooks),
        "post_hooks": dict(optimizer._global_optimizer_post_hooks),
    }


def test_every_patch_is_restored_and_torch_behaves_as_before():
    before_state = _snapshot()
    before = _train()
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before tracing: watched, then released
    with Tracer():
        during_state = _snapshot()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
    assert during_state != before_state
    assert _snapshot() == before_state
    assert not model.weight._post_accumulate_grad_hooks
    after = _train()
    for a, b in zip(before, after):
        assert torch.equal(a, b)


def test_restored_even_when_the_loop_is_stopped():
    before_state = _snapshot()
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
    assert _snapshot() == before_state


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
