"""The GL301 and GL204 fixes, built straight from the loop model's events (their rules land separately)."""

from __future__ import annotations

import libcst as cst
import pytest

from gradlint.events import EventKind
from gradlint.fixes.edits import apply_edits
from gradlint.fixes.fuse_into_backward import find_construction, optimi_release, release_fix, release_note
from gradlint.fixes.schedule import move_scheduler_step
from gradlint.build import build_model


def _model(text):
    return build_model(cst.parse_module(text))


def _events(model, kind, root=None):
    roots = [r for r in model.roots if root is None or r.name == root]
    return [e for r in roots for e in r.events if e.kind is kind]


def _apply(model, fix):
    edits = fix.edits() if fix is not None else None
    return apply_edits(model.module, edits).code if edits else None


# --------------------------------------------------------------------------- GL301

SCHEDULER_EVERY_MICRO_BATCH = """\
def train(model, loader, optimizer, scheduler, accum=4):
    for i, batch in enumerate(loader):
        loss = model(**batch).loss / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()  # warm-up schedule, per optimizer step
        log(i)
"""


def test_scheduler_step_moves_under_the_guard_right_after_the_optimizer_step():
    model = _model(SCHEDULER_EVERY_MICRO_BATCH)
    (sched,) = _events(model, EventKind.SCHED_STEP, "train")
    (step,) = _events(model, EventKind.STEP, "train")
    assert _apply(model, move_scheduler_step(model, sched, step)) == """\
def train(model, loader, optimizer, scheduler, accum=4):
    for i, batch in enumerate(loader):
        loss = model(**batch).loss / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            scheduler.step()  # warm-up schedule, per optimizer step
            optimizer.zero_grad()
        log(i)
"""


def test_scheduler_step_goes_after_the_scaler_update_when_a_scaler_steps():
    text = SCHEDULER_EVERY_MICRO_BATCH.replace(
        "            optimizer.step()\n", "            scaler.step(optimizer)\n            scaler.update()\n"
    ).replace("loss.backward()", "scaler.scale(loss).backward()")
    model = _model(text)
    (sched,) = _events(model, EventKind.SCHED_STEP, "train")
    (step,) = _events(model, EventKind.STEP, "train")
    fixed = _apply(model, move_scheduler_step(model, sched, step))
    assert "            scaler.update()\n            scheduler.step()  # warm-up" in fixed
    assert fixed.count("scheduler.step()") == 1


def test_scheduler_step_under_a_condition_of_its_own_is_left_alone():
    text = SCHEDULER_EVERY_MICRO_BATCH.replace("        scheduler.step()", "        if warmup:\n            scheduler.step()")
    model = _model(text)
    (sched,) = _events(model, EventKind.SCHED_STEP, "train")
    (step,) = _events(model, EventKind.STEP, "train")
    assert _apply(model, move_scheduler_step(model, sched, step)) is None


def test_moving_the_scheduler_is_idempotent_in_shape():
    model = _model(SCHEDULER_EVERY_MICRO_BATCH)
    (sched,) = _events(model, EventKind.SCHED_STEP, "train")
    (step,) = _events(model, EventKind.STEP, "train")
    once = _apply(model, move_scheduler_step(model, sched, step))
    again = _model(once)
    (sched,) = _events(again, EventKind.SCHED_STEP, "train")
    (step,) = _events(again, EventKind.STEP, "train")
    assert sched.frames == step.frames  # now under the guard: the rule has nothing left to report


# --------------------------------------------------------------------------- GL204

PLAIN_LOOP = """\
import torch


def train(model, loader, epochs=1):
    optimizer = {construction}
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
"""


def _release(text, root="train"):
    model = _model(text)
    (step,) = _events(model, EventKind.STEP, root)
    zeros = _events(model, EventKind.ZERO, root)
    construction = find_construction(model, step.target)
    assert construction is not None
    return model, optimi_release(model, step, zeros, construction), construction


@pytest.mark.parametrize(
    ("construction", "rewritten"),
    [
        (
            "torch.optim.AdamW(model.parameters(), lr=1e-3)",
            "AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, gradient_release=True)",
        ),
        (
            "torch.optim.AdamW(model.parameters(), 3e-4, (0.9, 0.95), weight_decay=0.1, fused=True)",
            "AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, gradient_release=True)",
        ),
        (
            "torch.optim.Adam(params=model.parameters(), eps=1e-6, amsgrad=False)",
            "Adam(params=model.parameters(), eps=1e-6, lr=1e-3, betas=(0.9, 0.999), gradient_release=True)",
        ),
        (
            "torch.optim.SGD(model.parameters(), 0.1, 0.9, 0, 5e-4)",
            "SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, gradient_release=True)",
        ),
    ],
)
def test_release_rewrite_carries_torch_values_over_explicitly(construction, rewritten):
    model, fix, _ = _release(PLAIN_LOOP.format(construction=construction))
    name = rewritten.split("(")[0]
    assert _apply(model, fix) == f"""\
import torch
from optimi import {name}, prepare_for_gradient_release


def train(model, loader, epochs=1):
    optimizer = {rewritten}
    prepare_for_gradient_release(model, optimizer)
    for epoch in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
"""


def test_release_note_names_the_defaults_that_differ():
    _, fix, construction = _release(PLAIN_LOOP.format(construction="torch.optim.AdamW(model.parameters())"))
    note = release_note(construction)
    assert "betas=(0.9, 0.99)" in note and "eps=1e-6" in note and "(0.9, 0.999)" in note and "1e-8" in note
    assert fix.description.startswith("rewrite to gradient release with optimi.AdamW; ") and note in fix.description


def _release_fix(text, root="train"):
    model = _model(text)
    (step,) = _events(model, EventKind.STEP, root)
    return model, release_fix(model, step, _events(model, EventKind.ZERO, root))


def test_release_fix_keeps_the_optimizer_and_adds_gradient_release_after_it():
    model, fix = _release_fix(PLAIN_LOOP.format(construction="torch.optim.SGD(model.parameters(), lr=0.1)"))
    assert fix.description.startswith("keep the optimizer and add `GradientRelease(optimizer)`")
    assert _apply(model, fix) == """\
import torch
from gradlint.runtime.release import GradientRelease


def train(model, loader, epochs=1):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    GradientRelease(optimizer)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
"""


@pytest.mark.parametrize(
    "construction",
    [
        "torch.optim.Adadelta(model.parameters())",  # no optimi twin: gradlint's release steps any torch optimizer
        "torch.optim.AdamW(params, lr=1e-3, amsgrad=True)",  # options and parameters optimi's rewrite could not keep
    ],
)
def test_gradlint_s_release_takes_any_torch_optimizer_as_it_is_built(construction):
    model, fix = _release_fix(PLAIN_LOOP.format(construction=construction))
    assert f"    optimizer = {construction}\n    GradientRelease(optimizer)\n" in _apply(model, fix)


def test_gradlint_s_release_stays_out_of_lbfgs_and_lookalikes():
    model, fix = _release_fix(PLAIN_LOOP.format(construction="torch.optim.LBFGS(model.parameters())"))
    assert fix.edits() is None  # LBFGS re-evaluates the loss inside step()
    text = "from mylib import AdamW\n" + PLAIN_LOOP.format(construction="AdamW(model.parameters(), lr=1e-3)")
    model, fix = _release_fix(text)
    assert fix.edits() is None


def test_gradlint_s_release_is_qualified_where_its_name_is_taken():
    text = "GradientRelease = None\n" + PLAIN_LOOP.format(construction="torch.optim.AdamW(model.parameters())")
    model, fix = _release_fix(text)
    fixed = _apply(model, fix)
    assert "import gradlint.runtime.release\n" in fixed
    assert "    gradlint.runtime.release.GradientRelease(optimizer)\n" in fixed


def test_a_module_that_already_uses_optimi_gets_optimi_s_release():
    text = "import optimi\n" + PLAIN_LOOP.format(construction="torch.optim.SGD(model.parameters(), lr=0.1)")
    model, fix = _release_fix(text)
    fixed = _apply(model, fix)
    assert "optimizer = SGD(model.parameters(), lr=0.1, gradient_release=True)" in fixed
    assert "GradientRelease" not in fixed
    # an optimizer optimi has no twin for still gets gradlint's
    text = "import optimi\n" + PLAIN_LOOP.format(construction="torch.optim.Adadelta(model.parameters())")
    model, fix = _release_fix(text)
    assert "    GradientRelease(optimizer)\n" in _apply(model, fix)


def test_release_fix_needs_exactly_one_construction():
    text = PLAIN_LOOP.format(construction="torch.optim.SGD(model.parameters(), lr=0.1)")
    text += "\n\noptimizer = torch.optim.AdamW(other.parameters())\n"
    model = _model(text)
    (step,) = _events(model, EventKind.STEP, "train")
    assert release_fix(model, step, []) is None


def test_release_rewrite_qualifies_optimi_names_that_are_already_taken():
    text = "from torch.optim import AdamW\n" + PLAIN_LOOP.format(construction="AdamW(model.parameters(), lr=1e-3)")
    model, fix, _ = _release(text)
    fixed = _apply(model, fix)
    assert "import optimi\n" in fixed
    assert "optimizer = optimi.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, gradient_release=True)" in fixed
    assert "optimi.prepare_for_gradient_release(model, optimizer)" in fixed


def test_release_rewrite_finds_the_optimizer_built_in_init_of_a_trainer():
    text = """\
import torch


class Trainer:
    def __init__(self, net):
        self.net = net
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-4)

    def fit(self, loader):
        for x, y in loader:
            self.opt.zero_grad(set_to_none=True)
            self.net(x).sub(y).pow(2).mean().backward()
            self.opt.step()
"""
    model, fix, _ = _release(text, root="Trainer.fit")
    fixed = _apply(model, fix)
    assert "        self.opt = AdamW(self.net.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, gradient_release=True)\n" in fixed
    assert "        prepare_for_gradient_release(self.net, self.opt)\n" in fixed
    assert "self.opt.step()" not in fixed and "zero_grad" not in fixed


@pytest.mark.parametrize(
    "construction",
    [
        "torch.optim.AdamW(model.parameters(), amsgrad=True)",  # optimi has no AMSGrad
        "torch.optim.SGD(model.parameters(), lr=0.1, nesterov=True)",
        "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1)",
        "torch.optim.AdamW(params, lr=1e-3)",  # parameters not given as model.parameters()
        "torch.optim.AdamW(model.parameters(), lr=1e-3, maximize=flag)",
        "torch.optim.AdamW(model.parameters(), **kwargs)",
    ],
)
def test_release_rewrite_stays_out_where_it_could_not_keep_the_numbers(construction):
    model, fix, _ = _release(PLAIN_LOOP.format(construction=construction))
    assert fix.edits() is None


def test_optimizers_without_an_optimi_twin_get_no_rewrite():
    model = _model(PLAIN_LOOP.format(construction="torch.optim.Adadelta(model.parameters())"))
    (step,) = _events(model, EventKind.STEP, "train")
    construction = find_construction(model, step.target)
    assert optimi_release(model, step, [], construction) is None
    assert release_note(construction) is None


def test_release_rewrite_needs_the_torch_optimizer_not_a_lookalike():
    text = "from mylib import AdamW\n" + PLAIN_LOOP.format(construction="AdamW(model.parameters(), lr=1e-3)")
    model, fix, _ = _release(text)
    assert fix.edits() is None


def test_a_step_whose_result_is_used_keeps_the_loop_for_a_human():
    text = PLAIN_LOOP.format(construction="torch.optim.AdamW(model.parameters())").replace(
        "            optimizer.step()", "            result = optimizer.step()"
    )
    model, fix, _ = _release(text)
    assert fix.edits() is None


def test_where_optimi_s_rewrite_cannot_keep_the_numbers_gradlint_s_release_is_written():
    text = "import optimi\n" + PLAIN_LOOP.format(construction="torch.optim.AdamW(model.parameters(), amsgrad=True)")
    model, fix = _release_fix(text)
    assert "    GradientRelease(optimizer)\n" in _apply(model, fix)
