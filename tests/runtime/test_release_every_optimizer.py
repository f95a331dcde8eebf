"""Gradient release with the optimizer's own kernel against the plain loop, bitwise, for every torch.optim
optimizer and every LR scheduler (the fused kernel is compared in test_release.py).

The list is read from torch itself, so an optimizer or scheduler added by a
new torch version fails here until it is given constructor arguments below.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

from gradlint.runtime.release import ReleaseUnsupported, enable_gradient_release

# Built with their defaults wherever they allow it (CPU: the per-tensor kernel).
OPTIMIZERS = {
    "ASGD": lambda ps: torch.optim.ASGD(ps, lr=1e-2),
    "Adadelta": lambda ps: torch.optim.Adadelta(ps),
    "Adafactor": lambda ps: torch.optim.Adafactor(ps, lr=1e-2),
    "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    "Adamax": lambda ps: torch.optim.Adamax(ps, lr=1e-2),
    "Muon": lambda ps: torch.optim.Muon(ps, lr=1e-2),
    "NAdam": lambda ps: torch.optim.NAdam(ps, lr=1e-2),
    "RAdam": lambda ps: torch.optim.RAdam(ps, lr=1e-2),
    "RMSprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-2),
    "Rprop": lambda ps: torch.optim.Rprop(ps, lr=1e-2),
    "SGD": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "SparseAdam": lambda ps: torch.optim.SparseAdam(ps, lr=1e-2),
}
REFUSED = {"LBFGS"}  # re-evaluates the loss inside step(): refused, tested below

SCHEDULERS = {
    "LambdaLR": lambda o: lr_scheduler.LambdaLR(o, lambda n: 0.9**n),
    "MultiplicativeLR": lambda o: lr_scheduler.MultiplicativeLR(o, lambda n: 0.8),
    "StepLR": lambda o: lr_scheduler.StepLR(o, step_size=2, gamma=0.3),
    "MultiStepLR": lambda o: lr_scheduler.MultiStepLR(o, milestones=[2, 4], gamma=0.3),
    "ConstantLR": lambda o: lr_scheduler.ConstantLR(o, factor=0.5, total_iters=3),
    "LinearLR": lambda o: lr_scheduler.LinearLR(o, start_factor=0.2, total_iters=4),
    "ExponentialLR": lambda o: lr_scheduler.ExponentialLR(o, gamma=0.7),
    "SequentialLR": lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.ConstantLR(o, factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(o, gamma=0.7)], milestones=[2]
    ),
    "PolynomialLR": lambda o: lr_scheduler.PolynomialLR(o, total_iters=6, power=2.0),
    "CosineAnnealingLR": lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=4),
    "ChainedScheduler": lambda o: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(o, factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(o, gamma=0.7)]
    ),
    "ReduceLROnPlateau": lambda o: lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5),
    "CyclicLR": lambda o: lr_scheduler.CyclicLR(o, base_lr=1e-3, max_lr=1e-1, step_size_up=2),
    "CosineAnnealingWarmRestarts": lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=3),
    "OneCycleLR": lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20),
}


def _classes(module, base):
    return {n for n, c in vars(module).items() if inspect.isclass(c) and issubclass(c, base) and not n.startswith("_")}


def test_the_lists_cover_everything_torch_ships():
    assert _classes(torch.optim, torch.optim.Optimizer) - {"Optimizer"} == set(OPTIMIZERS) | REFUSED
    assert _classes(lr_scheduler, lr_scheduler.LRScheduler) - {"LRScheduler"} == set(SCHEDULERS)


class _Model(nn.Module):
    def __init__(self, sparse: bool, matrices_only: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6, sparse=sparse)
        self.body = nn.Sequential(nn.Linear(6, 8, bias=not matrices_only), nn.Tanh(), nn.Linear(8, 3, bias=not matrices_only))

    def forward(self, tokens):
        return self.body(self.embed(tokens))


def _train(opt_name, sched_name, release, steps=7):
    torch.manual_seed(0)
    model = _Model(sparse=opt_name == "SparseAdam", matrices_only=opt_name == "Muon")
    params = list(model.parameters())
    if opt_name == "Muon":  # matrices only
        params = list(model.body.parameters())
    elif opt_name == "SparseAdam":  # sparse gradients only
        params = list(model.embed.parameters())
    opt = OPTIMIZERS[opt_name](params)
    handle = enable_gradient_release(opt, fused=False) if release else None
    sched = SCHEDULERS[sched_name](opt) if sched_name else None
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randint(0, 10, (5,), generator=gen)).square().mean()
        loss.backward()
        opt.step()
        if isinstance(sched, lr_scheduler.ReduceLROnPlateau):
            sched.step(loss.item())
        elif sched is not None:
            sched.step()
    if handle:
        handle.remove()
    return [p.detach().clone() for p in params], [g["lr"] for g in opt.param_groups]


def _assert_bitwise(opt_name, sched_name):
    (plain, plain_lr), (released, released_lr) = _train(opt_name, sched_name, False), _train(opt_name, sched_name, True)
    assert plain_lr == released_lr
    for a, b in zip(plain, released, strict=True):
        assert torch.equal(a, b)
    start, _ = _train(opt_name, sched_name, False, steps=0)
    assert any(not torch.equal(a, b) for a, b in zip(start, plain))


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_every_optimizer_is_bitwise_equal_under_release(opt_name):
    _assert_bitwise(opt_name, None)


@pytest.mark.parametrize("sched_name", sorted(SCHEDULERS))
def test_every_scheduler_drives_the_released_optimizer_as_the_plain_one(sched_name):
    _assert_bitwise("SGD", sched_name)


def test_lbfgs_is_refused():
    with pytest.raises(ReleaseUnsupported, match="LBFGS"):
        enable_gradient_release(torch.optim.LBFGS(nn.Linear(2, 1).parameters()))
