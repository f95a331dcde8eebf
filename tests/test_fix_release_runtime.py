"""The GL204 rewrites run, and train to the same parameters as the loop they replaced.

torch.optim's default AdamW runs the multi-tensor (foreach) kernels;
gradlint's ``GradientRelease`` steps buckets of parameters through the fused
kernel from backward hooks, and optimi with gradient release one parameter at
a time. All are float32 on the CPU here, so the parameters may differ only by
rounding: the tolerance is a few float32 ulps per step.
"""

from __future__ import annotations

import runpy

import libcst as cst
import pytest

from fix_harness import FIXED
from fixture_markers import FIXTURES
from gradlint.events import EventKind
from gradlint.fixes.edits import apply_edits
from gradlint.fixes.fuse_into_backward import find_construction, gradlint_release, optimi_release
from gradlint.build import build_model

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.runtime

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

SCRIPT = """\
import torch
from torch import nn


def train(steps=25):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 2))
    optimizer = {construction}
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 6, generator=generator)
        y = torch.stack([x.sum(1), x[:, 0] * x[:, 1]], dim=1)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return model
"""


REWRITES = ["gradlint", "optimi"]
MARK = {"gradlint": "GradientRelease(optimizer)", "optimi": "gradient_release=True"}


def _rewrite(text: str, which: str = "gradlint", root: str = "train") -> str:
    if which == "optimi":
        pytest.importorskip("optimi")
    model = build_model(cst.parse_module(text))
    events = next(r for r in model.roots if r.name == root).events
    (step,) = [e for e in events if e.kind is EventKind.STEP]
    zeros = [e for e in events if e.kind is EventKind.ZERO]
    construction = find_construction(model, step.target)
    fix = gradlint_release(model, construction) if which == "gradlint" else optimi_release(model, step, zeros, construction)
    return apply_edits(model.module, fix.edits()).code


def _train(text: str, tmp_path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return runpy.run_path(str(path))["train"]()


def _assert_same_parameters(original, rewritten):
    pairs = list(zip(original.parameters(), rewritten.parameters(), strict=True))
    moved = any(not torch.equal(a, torch.zeros_like(a)) for a, _ in pairs)
    assert moved
    for a, b in pairs:
        torch.testing.assert_close(b, a, **TOLERANCE)


def test_the_shipped_example_and_its_rewrite_train_to_the_same_parameters():
    original = runpy.run_path(str(FIXTURES / "fixable" / "release_candidate_adamw.py"))["train"]()
    rewritten_text = (FIXED / "fixable" / "release_candidate_adamw.py").read_text(encoding="utf-8")
    assert "    GradientRelease(optimizer)\n" in rewritten_text and "        optimizer.step()\n" in rewritten_text
    rewritten = runpy.run_path(str(FIXED / "fixable" / "release_candidate_adamw.py"))["train"]()
    _assert_same_parameters(original, rewritten)


def test_the_shipped_example_rewrite_is_what_the_fix_produces():
    buggy = (FIXTURES / "fixable" / "release_candidate_adamw.py").read_text(encoding="utf-8")
    assert _rewrite(buggy) == (FIXED / "fixable" / "release_candidate_adamw.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "construction",
    [
        "torch.optim.AdamW(model.parameters(), lr=1e-2)",
        "torch.optim.AdamW(model.parameters(), 5e-3, (0.8, 0.9), 1e-7, 0.2)",
        "torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.01)",
        "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)",
        "torch.optim.SGD(model.parameters(), 0.05)",
    ],
)
@pytest.mark.parametrize("which", REWRITES)
def test_rewritten_loops_match_torch_optim(construction, which, tmp_path):
    original_text = SCRIPT.format(construction=construction)
    rewritten_text = _rewrite(original_text, which)
    assert MARK[which] in rewritten_text
    original = _train(original_text, tmp_path, "original")
    rewritten = _train(rewritten_text, tmp_path, "rewritten")
    _assert_same_parameters(original, rewritten)


@pytest.mark.parametrize("which", REWRITES)
def test_gradients_are_released_during_backward_in_the_rewrite(which, tmp_path):
    text = _rewrite(SCRIPT.format(construction="torch.optim.AdamW(model.parameters(), lr=1e-2)"), which)
    model = _train(text, tmp_path, "rewritten")
    assert all(p.grad is None for p in model.parameters())
