"""The loop model: which events a piece of code produces, under which guard, against which target."""

from __future__ import annotations

import textwrap

import libcst as cst

from gradlint.events import EventKind
from gradlint.build import build_model
from gradlint.model import FrameKind, LoopModel, Root
from gradlint.objects import ObjKind
from gradlint.queries import backwards_reaching, clears, exclusive, leaves_before, stepping_loop


def model_of(code: str) -> LoopModel:
    return build_model(cst.parse_module(textwrap.dedent(code)))


def root(model: LoopModel, name: str) -> Root:
    return next(r for r in model.roots if r.name == name)


def kinds(events) -> list[str]:
    return [str(e.kind) for e in events]


def test_self_method_named_backward_is_inlined_not_taken_for_a_backward():
    model = model_of(
        """
        class Trainer:
            def backward(self, loss):
                self.scaler.scale(loss).backward()

            def fit(self):
                for batch in self.loader:
                    loss = self.model(batch)
                    self.backward(loss)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
        """
    )
    events = root(model, "Trainer.fit").events
    assert kinds(events) == ["BACKWARD", "STEP", "SCALER_UPDATE"]
    backward = events[0]
    assert backward.scaled
    assert isinstance(backward.loss, cst.Name) and backward.loss.value == "loss"
    assert len(backward.call_chain) == 1  # reached through self.backward(...)
    assert [f.kind for f in backward.frames] == [FrameKind.LOOP]


def test_helper_that_divides_a_name_then_returns_it_gives_a_normalised_backward():
    model = model_of(
        """
        def compute_loss(model, batch, accum):
            loss = model(batch)
            loss = loss / accum
            return loss

        def raw_loss(model, batch):
            loss = model(batch)
            return loss

        def train(model, loader, optimizer, accum):
            for i, batch in enumerate(loader):
                loss = compute_loss(model, batch, accum)
                loss.backward()
                other = raw_loss(model, batch)
                other.backward()
        """
    )
    first, second = [e for e in root(model, "train").events if e.kind is EventKind.BACKWARD]
    assert first.normalised
    assert not second.normalised


def _zeros(code: str, name: str = "train"):
    return [e for e in root(model_of(code), name).events if e.kind is EventKind.ZERO]


def test_grad_of_one_named_tensor_is_that_tensors_own():
    (zero,) = _zeros(
        """
        def train(model, X, y, opt):
            delta = torch.zeros_like(X, requires_grad=True)
            for _ in range(7):
                model(X + delta).sum().backward()
                delta.grad.zero_()
        """
    )
    assert zero.target == "delta"
    assert zero.target_kind is ObjKind.TENSOR
    assert zero.manual and zero.set_to_none is False


def test_grad_bound_by_a_parameter_loop_belongs_to_the_model():
    (zero,) = _zeros(
        """
        def train(model):
            for p in model.parameters():
                p.grad.data.zero_()
        """
    )
    assert (zero.target, zero.target_kind) == ("model", ObjKind.MODEL)


def test_grad_of_a_helper_argument_is_not_taken_for_a_lone_tensor():
    # The caller may pass each parameter in turn: whose gradient it is stays unknown.
    (zero,) = _zeros(
        """
        def clear(p):
            p.grad = None
        """,
        name="clear",
    )
    assert zero.target is None
    assert zero.target_kind is ObjKind.UNKNOWN


def test_zeros_like_of_the_parameter_is_a_fresh_buffer_not_a_kept_one():
    fresh, kept = _zeros(
        """
        def train(model):
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            for p in model.parameters():
                p.grad = torch.zeros_like(p.grad)
        """
    )
    assert fresh.set_to_none is None
    assert kept.set_to_none is False


def test_a_lone_tensor_clear_reaches_only_optimizers_not_built_from_models():
    model = model_of(
        """
        import torch

        def train(model, X):
            w = torch.zeros(3, requires_grad=True)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            hand = torch.optim.SGD([w], lr=0.1)
            for x in X:
                w.grad.zero_()
                opt.step()
                hand.step()
        """
    )
    events = root(model, "train").events
    zero = next(e for e in events if e.kind is EventKind.ZERO)
    assert not clears(model, zero, "opt")
    assert clears(model, zero, "hand")


FP16_BRANCHES = """
def train(loader, optimizer, scaler, fp16):
    for batch in loader:
        loss = model(batch)
        if fp16:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        if fp16:
            scaler.step(optimizer)
        else:
            optimizer.step()
"""


def test_backwards_in_both_branches_of_an_if_both_reach_what_follows():
    events = root(model_of(FP16_BRANCHES), "train").events
    scaled, plain = [e for e in events if e.kind is EventKind.BACKWARD]
    clip = next(e for e in events if e.kind is EventKind.CLIP)
    scaler_step, plain_step = [e for e in events if e.kind is EventKind.STEP]
    assert exclusive(scaled, plain) and exclusive(scaler_step, plain_step)
    assert not exclusive(scaled, clip)
    assert backwards_reaching(events, clip) == [plain, scaled]
    # Two separate ``if fp16:`` tests are not known to agree: both backwards may reach either step.
    assert backwards_reaching(events, plain_step) == [plain, scaled]


def test_a_step_in_the_other_branch_of_the_same_if_is_not_reached():
    events = root(
        model_of(
            """
            def train(loader, optimizer, scaler, fp16):
                for batch in loader:
                    if fp16:
                        scaler.scale(model(batch)).backward()
                        scaler.step(optimizer)
                    else:
                        model(batch).backward()
                        optimizer.step()
            """
        ),
        "train",
    ).events
    scaled, plain = [e for e in events if e.kind is EventKind.BACKWARD]
    scaler_step, plain_step = [e for e in events if e.kind is EventKind.STEP]
    assert backwards_reaching(events, plain_step) == [plain]
    assert backwards_reaching(events, scaler_step) == [scaled]


def test_a_later_backward_on_the_same_path_hides_an_earlier_one_and_unscale_stops_the_reading():
    events = root(
        model_of(
            """
            def train(loader, optimizer, scaler):
                for batch in loader:
                    scaler.scale(model(batch)).backward()
                    scaler.unscale_(optimizer)
                    model(batch).backward()
                    clip_grad_norm_(model.parameters(), 1.0)
            """
        ),
        "train",
    ).events
    first, second = [e for e in events if e.kind is EventKind.BACKWARD]
    clip = events[-1]
    assert backwards_reaching(events, clip) == [second]
    assert backwards_reaching(events, first) == []
    assert backwards_reaching(events, second, stop=lambda e: e.kind is EventKind.UNSCALE) == []


def test_the_stepping_loop_of_a_micro_step_backward_is_the_outer_loop():
    model = model_of(
        """
        def train(model, get_batch, optimizer, scaler, accum):
            for it in range(1000):
                for micro_step in range(accum):
                    scaler.scale(model(get_batch()) / accum).backward()
                optimizer.step()
        """
    )
    r = root(model, "train")
    backward = next(e for e in r.events if e.kind is EventKind.BACKWARD)
    outer, micro = backward.loops
    assert stepping_loop(r, backward) is outer
    assert any(e.kind is EventKind.STEP for e in r.events_in(outer))
    assert not any(e.kind is EventKind.STEP for e in r.events_in(micro))


def test_a_branch_that_ends_in_continue_leaves_before_the_step():
    events = root(
        model_of(
            """
            def train(loader, optimizer):
                for batch in loader:
                    model(batch).backward()
                    norm = clip_grad_norm_(model.parameters(), 1.0)
                    if not norm.isfinite():
                        optimizer.zero_grad()
                        continue
                    elif norm > 100:
                        print(norm)
                    else:
                        optimizer.zero_grad()
                    optimizer.step()
            """
        ),
        "train",
    ).events
    skip_clear, else_clear = [e for e in events if e.kind is EventKind.ZERO]
    step = next(e for e in events if e.kind is EventKind.STEP)
    skip_branch = skip_clear.frames[-1]
    assert skip_branch.kind is FrameKind.BRANCH and skip_branch.exits
    assert leaves_before(skip_clear, step)
    # The else of an elif does not leave: its own block ends in a plain call.
    assert not any(f.exits for f in else_clear.frames)
    assert not leaves_before(else_clear, step)


def test_autograd_backward_backpropagates_its_first_argument():
    import libcst as cst
    from gradlint.events import EventKind
    from gradlint.build import build_model

    model = build_model(
        cst.parse_module("import torch\nfor x in data:\n    loss = f(x) / 4\n    torch.autograd.backward(loss)\n")
    )
    [backward] = [e for root in model.roots for e in root.events if e.kind is EventKind.BACKWARD]
    assert model.code(backward.loss) == "loss"
    assert backward.normalised


def test_literals_in_any_spelling_are_read_without_crashing():
    from gradlint.linter import lint_text

    text = (
        "import torch\nopt = torch.optim.SGD(params, lr=0.1)\n"
        "for x in data:\n    loss(x).backward()\n    opt.step()\n"
        "    for p in params:\n        p.grad.fill_(0x0)\n"
    )
    result = lint_text(text, "hex.py")
    assert result.error is None
    assert [f.code for f in result.findings] == ["GL005"]


def test_an_object_built_by_a_helper_of_the_module_has_the_kind_the_helper_constructs():
    model = model_of(
        """
        from accelerate import Accelerator
        from torch.optim import AdamW

        class Trainer:
            def __init__(self, net):
                self._accelerator = self._create_accelerator()
                self.tool = self._make(net)
                self.other = self._either(net)

            def _create_accelerator(self):
                return Accelerator()

            def _make(self, net):
                opt = AdamW(net.parameters())
                return opt

            def _either(self, net):
                if net.frozen:
                    return Accelerator()
                return AdamW(net.parameters())
        """
    )
    assert model.info("self._accelerator").kind is ObjKind.PREPARER
    # only constructors written in the return are read: a returned name or two kinds give no kind
    assert model.info("self.tool").kind is ObjKind.UNKNOWN
    assert model.info("self.other").kind is ObjKind.UNKNOWN
