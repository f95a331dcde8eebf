"""The loop model: which events a piece of code produces, under which guard, against which target."""

from __future__ import annotations

import textwrap

import libcst as cst

from gradlint.events import EventKind
from gradlint.model import FrameKind, LoopModel, Root, build_model


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
