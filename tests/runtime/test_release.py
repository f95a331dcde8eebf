"""Fused gradient release: bitwise equal to the plain loop, schedulers work, unsupported set-ups are refused."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from gradlint.runtime.release import GradientRelease, ReleaseUnsupported, enable_gradient_release

OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "adam-default": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2, weight_decay=1e-4),
}
FUSED_TWINS = {  # the same optimizers built with fused=True
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4, fused=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "adam-default": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2, weight_decay=1e-4, fused=True),
}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 2))


def _train(make_opt, release, steps=7, scheduler=False, model=None, opt=None, start=0, fused=False):
    model = model or _model()
    opt = opt or make_opt(model.parameters())
    handle = enable_gradient_release(opt, fused=fused) if release else None
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3) if scheduler else None
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(20, 8, 5, generator=gen)
    for i in range(start, start + steps):
        opt.zero_grad()
        loss = model(data[i]).square().mean()
        loss.backward()
        if release:
            assert all(p.grad is None for p in model.parameters())
        opt.step()
        if sched:
            sched.step()
    if handle:
        handle.remove()
    return model, opt


@pytest.mark.parametrize("scheduler", [False, True], ids=["no-sched", "steplr"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_release_with_the_optimizers_own_kernel_is_bitwise_equal_to_the_plain_loop(name, scheduler):
    plain, _ = _train(OPTIMIZERS[name], release=False, scheduler=scheduler)
    released, _ = _train(OPTIMIZERS[name], release=True, scheduler=scheduler, fused=False)
    for a, b in zip(plain.parameters(), released.parameters()):
        assert torch.equal(a, b)
    untrained = _model()
    assert not torch.equal(next(untrained.parameters()), next(released.parameters()))


@pytest.mark.parametrize("scheduler", [False, True], ids=["no-sched", "steplr"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_release_through_the_fused_kernel_equals_the_fused_plain_loop_and_rounds_otherwise(name, scheduler):
    """The fused kernel is elementwise: stepping in buckets changes no bit against ``fused=True`` as written."""
    make = OPTIMIZERS[name]
    released, opt = _train(make, release=True, scheduler=scheduler, fused=True)
    fused_plain, fused_opt = _train(FUSED_TWINS[name], release=False, scheduler=scheduler)
    assert fused_opt.param_groups[0]["fused"] is True
    for a, b in zip(fused_plain.parameters(), released.parameters()):
        assert torch.equal(a, b)
    as_written, _ = _train(make, release=False, scheduler=scheduler)
    for a, b in zip(as_written.parameters(), released.parameters()):  # another kernel: rounding only
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_release_steps_in_buckets_once_the_order_is_known():
    """The first backward steps parameter by parameter; later ones one optimizer call per bucket."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])  # 12 tensors of 256 or 32 bytes
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    calls = []
    handle = GradientRelease(opt, bucket_bytes=600)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = register_optimizer_step_post_hook(lambda o, a, k: calls.append(len(o.param_groups[0]["params"])))
    try:
        for step in range(3):
            calls.clear()
            model(torch.randn(4, 8)).square().mean().backward()
            assert all(p.grad is None for p in model.parameters())
            opt.step()
            assert sum(calls) == 12
            if step == 0:
                assert calls == [1] * 12
            else:  # weight + bias of two layers fit in 600 bytes, never three
                assert calls == [4, 4, 4], calls
    finally:
        hook.remove()
        handle.remove()
    assert handle.kernel == ["fused"]


def test_steplr_really_changes_the_step_size():
    # loss = w . x has the constant gradient x: each update is exactly -lr * x.
    w = nn.Parameter(torch.zeros(3))
    x = torch.tensor([1.0, 2.0, 4.0])
    opt = torch.optim.SGD([w], lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    deltas = []
    with GradientRelease(opt):
        for _ in range(3):
            before = w.detach().clone()
            (w * x).sum().backward()
            opt.step()
            sched.step()
            deltas.append(before - w.detach())
    assert torch.equal(deltas[0], x)
    assert torch.equal(deltas[1], 0.5 * x)
    assert torch.equal(deltas[2], 0.25 * x)


def test_state_dict_round_trip_continues_bitwise():
    make = OPTIMIZERS["adamw"]
    whole, _ = _train(make, release=True, steps=6)
    model, opt = _train(make, release=True, steps=3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    assert len(opt.state_dict()["state"]) == len(list(model.parameters()))
    buf.seek(0)
    saved = torch.load(buf)
    model2 = _model()
    opt2 = make(model2.parameters())
    with GradientRelease(opt2):
        model2.load_state_dict(saved["model"])
        opt2.load_state_dict(saved["opt"])
    resumed, _ = _train(make, release=True, steps=3, model=model2, opt=opt2, start=3)
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_step_and_zero_grad_are_no_ops_and_remove_restores_them():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = GradientRelease(opt)
    model(torch.randn(2, 5)).sum().backward()
    snapshot = [p.detach().clone() for p in model.parameters()]
    opt.step()
    opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(snapshot, model.parameters()))
    handle.remove()
    assert "step" not in opt.__dict__ and "zero_grad" not in opt.__dict__
    model(torch.randn(2, 5)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(snapshot, model.parameters()))


def test_gradscaler_is_refused():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with GradientRelease(opt):
        scaler.scale(model(torch.randn(2, 5)).sum()).backward()
        with pytest.raises(ReleaseUnsupported, match="GradScaler"):
            scaler.step(opt)
    # once released, the same scaler and optimizer work together again
    opt.zero_grad()
    scaler2 = torch.amp.GradScaler("cpu")
    scaler2.scale(model(torch.randn(2, 5)).sum()).backward()
    before = [p.detach().clone() for p in model.parameters()]
    scaler2.step(opt)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_disabled_scaler_is_not_refused_and_trains_as_the_plain_loop():
    def train(release):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        # the plain loop's kernel, so the two are bitwise equal on any build (the default fused kernel rounds
        # differently from SGD's for-loop on torch 2.11's CPU)
        handle = GradientRelease(opt, fused=False) if release else None
        gen = torch.Generator().manual_seed(3)
        for _ in range(4):
            opt.zero_grad()
            scaler.scale(model(torch.randn(2, 5, generator=gen)).square().sum()).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        if handle:
            handle.remove()
        return list(model.parameters())

    for a, b in zip(train(False), train(True)):
        assert torch.equal(a, b)


def test_clipping_is_refused():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradientRelease(opt):
        model(torch.randn(2, 5)).sum().backward()
        with pytest.raises(ReleaseUnsupported, match="clipping"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    # guards are gone once no optimizer is released
    model(torch.randn(2, 5)).sum().backward()
    assert torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) > 0


# bound before release is enabled, as `from torch.nn.utils import clip_grad_norm_` at the top of a script does
from torch.nn.utils import clip_grad_norm_ as early_clip_grad_norm_  # noqa: E402
from torch.nn.utils.clip_grad import clip_grad_value_ as early_clip_grad_value_  # noqa: E402

CLIPPING_CALLS = {
    "early-bound clip_grad_norm_": lambda m: early_clip_grad_norm_(m.parameters(), 1.0),
    "early-bound clip_grad_value_": lambda m: early_clip_grad_value_(m.parameters(), 0.1),
    "clip_grad.clip_grad_norm_": lambda m: torch.nn.utils.clip_grad.clip_grad_norm_(m.parameters(), 1.0),
    "clip_grads_with_norm_": lambda m: torch.nn.utils.clip_grads_with_norm_(list(m.parameters()), 1.0, torch.tensor(2.0)),
    "get_total_norm": lambda m: torch.nn.utils.get_total_norm([p.grad for p in m.parameters() if p.grad is not None]),
    "deprecated clip_grad_norm": lambda m: torch.nn.utils.clip_grad_norm(m.parameters(), 1.0),
    "filtered parameter list": lambda m: torch.nn.utils.clip_grad_norm_([p for p in m.parameters() if p.grad is not None], 1.0),
}


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", sorted(CLIPPING_CALLS))
def test_every_way_to_reach_clipping_is_refused(name):
    call = CLIPPING_CALLS[name]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradientRelease(opt):
        model(torch.randn(2, 5)).sum().backward()
        with pytest.raises(ReleaseUnsupported, match="clipping"):
            call(model)
    # the same function objects clip again once release is off
    model(torch.randn(2, 5)).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    call(model)
    if "norm" not in name or "with_norm" in name or "clip_grad_norm" in name:
        assert any(not torch.equal(a, p.grad) for a, p in zip(before, model.parameters()))


def test_clipping_inside_a_release_hook_is_allowed():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []

    def clip_one(p):  # runs before release's own hook, registered later, steps and frees p.grad
        torch.nn.utils.clip_grad_norm_(p, 1e-3)
        norms.append(float(p.grad.norm()))

    handles = [p.register_post_accumulate_grad_hook(clip_one) for p in model.parameters()]
    with GradientRelease(opt):
        model(torch.randn(2, 5)).sum().backward()
        opt.step()
    for h in handles:
        h.remove()
    assert len(norms) == 6 and all(n <= 1e-3 * (1 + 1e-5) for n in norms)


@pytest.mark.parametrize("steps_before", [0, 1])
def test_accumulation_is_refused_on_the_second_backward_of_a_step(steps_before):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradientRelease(opt):
        for _ in range(steps_before):
            model(torch.randn(2, 5)).sum().backward()
            opt.step()
        model(torch.randn(2, 5)).sum().backward()
        with pytest.raises(ReleaseUnsupported, match="accumulation"):
            model(torch.randn(2, 5)).sum().backward()


def test_lbfgs_is_refused():
    with pytest.raises(ReleaseUnsupported, match="LBFGS"):
        GradientRelease(torch.optim.LBFGS(_model().parameters()))


def _train_changing(release, setup, steps=8, zero_kwargs=None, clear_module=False):
    """A loop whose set-up changes while it trains: ``setup(i, model, opt)`` runs before step ``i``."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"a": nn.Linear(5, 8), "b": nn.Linear(8, 2), "c": nn.Linear(5, 2)})
    model["b"].requires_grad_(False)
    opt = torch.optim.AdamW(list(model["a"].parameters()) + list(model["b"].parameters()), lr=1e-2, weight_decay=0.1)
    handle = enable_gradient_release(opt, fused=False) if release else None
    data = torch.randn(steps, 4, 5, generator=torch.Generator().manual_seed(1))
    for i in range(steps):
        setup(i, model, opt)
        (model if clear_module else opt).zero_grad(**(zero_kwargs or {}))
        x = data[i]
        out = model["b"](model["a"](x).relu())
        if i % 3 != 2:  # "c" is reached on two steps out of three only
            out = out + model["c"](x)
        out.square().mean().backward()
        opt.step()
    if handle:
        handle.remove()
    return model


def _add_group(i, model, opt):
    if i == 2:
        opt.add_param_group({"params": list(model["c"].parameters()), "lr": 5e-3})


def _unfreeze(i, model, opt):
    if i == 3:
        model["b"].requires_grad_(True)


CHANGES = {
    "add_param_group": (_add_group, None),
    "unfrozen after set-up": (_unfreeze, None),
    "both, set_to_none=False": (lambda i, m, o: (_add_group(i, m, o), _unfreeze(i, m, o)), {"set_to_none": False}),
}
BOTH = CHANGES["both, set_to_none=False"][0]


def test_module_zero_grad_set_to_none_false_matches_the_plain_loop():
    plain = _train_changing(False, BOTH, zero_kwargs={"set_to_none": False}, clear_module=True)
    released = _train_changing(True, BOTH, zero_kwargs={"set_to_none": False}, clear_module=True)
    other = _train_changing(False, BOTH, clear_module=True)  # set_to_none=True trains differently here
    assert not torch.equal(plain["c"].weight, other["c"].weight)
    for (key, a), (_, b) in zip(plain.named_parameters(), released.named_parameters()):
        assert torch.equal(a, b), key


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_parameters_added_or_unfrozen_after_set_up_are_stepped_as_in_the_plain_loop(name):
    setup, zero_kwargs = CHANGES[name]
    plain = _train_changing(False, setup, zero_kwargs=zero_kwargs)
    released = _train_changing(True, setup, zero_kwargs=zero_kwargs)
    untouched = _train_changing(False, lambda i, m, o: None)
    for (key, a), (_, b) in zip(plain.named_parameters(), released.named_parameters()):
        assert torch.equal(a, b), key
    # the change mattered: without it, "b" and "c" would not have moved
    assert not torch.equal(plain["c"].weight, untouched["c"].weight) or not torch.equal(plain["b"].weight, untouched["b"].weight)
