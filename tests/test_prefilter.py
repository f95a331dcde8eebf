"""The prefilter never hides a finding: results with and without it are identical.

It is checked on every fixture, token by token, and (marked slow) on the
sources of real packages downloaded with pip.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import zipfile

import pytest

from fixture_markers import FIXTURES, expected_findings, marker_fixtures
from gradlint import linter, runner
from gradlint.config import Config
from gradlint.linter import lint_text, might_fire, needed_tokens
from gradlint.rule import BACKWARD, SCALER, STEP, call_of, word
from gradlint.python_nodes import FiledTree
from gradlint.rules import ALL_RULES
from gradlint.rules.clearing import GRAD_ASSIGNED, GRAD_ZEROED_BY_METHOD, ZEROING_VALUE
from gradlint.rules.parameters import FREEZES

EVERY_RULE = dataclasses.replace(Config(), select=("ALL",))
ALL_FIXTURES = sorted(FIXTURES.rglob("*.py"))


def outcome(result):
    return result.error, [dataclasses.astuple(f) for f in result.findings]


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_prefilter_changes_nothing_on_fixtures(path):
    text = path.read_text(encoding="utf-8")
    for config in (Config(), EVERY_RULE):
        with_filter = lint_text(text, str(path), config, prefilter=True)
        without = lint_text(text, str(path), config, prefilter=False)
        assert outcome(with_filter) == outcome(without)


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_each_rule_lets_through_every_fixture_it_fires_on(rule):
    firing = [p for p in marker_fixtures() if any(code == rule.code for _, code in expected_findings(p.read_text(encoding="utf-8")))]
    assert firing, f"no fixture expects {rule.code}"
    assert rule.needs, f"{rule.code} has no prefilter tokens"
    for path in firing:
        assert might_fire(path.read_text(encoding="utf-8"), [rule]), f"{rule.code}'s tokens hide {path.name}"


def test_the_prefilter_skips_most_fixtures_without_findings_for_no_rule():
    """Not vacuous: plain code without a training loop is rejected by every rule."""
    assert not might_fire("import torch\n\ndef forward(x):\n    return x.requires_grad_()  # backward compatible\n", ALL_RULES)


@pytest.mark.parametrize(
    "token, text, present",
    [
        (STEP, "opt.step()", True),
        (STEP, "opt . step (closure)", True),
        (STEP, "xm.optimizer_step(opt)", True),
        (STEP, "(opt.step\n)()", True),
        (STEP, "(opt.step  # why\n)()", True),
        (STEP, "max_steps = 10\nstep_size = 2\nstep = 0", False),
        (BACKWARD, "loss.backward()", True),
        (BACKWARD, "self.manual_backward(loss)", True),
        (BACKWARD, "from torch.autograd import backward as bw", True),
        (BACKWARD, "(loss.backward)()", True),
        (BACKWARD, "# kept for backward compatibility", False),
        (word("grad"), "p.grad.zero_()", True),
        (GRAD_ZEROED_BY_METHOD, "p.grad.zero_()", True),
        (GRAD_ZEROED_BY_METHOD, "p.grad.data.zero_()", True),
        (GRAD_ZEROED_BY_METHOD, "(p.grad).fill_(0)", True),
        (GRAD_ZEROED_BY_METHOD, "p.grad \\\n    .mul_(0)", True),
        (GRAD_ZEROED_BY_METHOD, "p.grad = 0 * p.grad; opt.zero_grad(); x.zero_()", False),
        (GRAD_ASSIGNED, "p.grad = 0 * p.grad", True),
        (GRAD_ASSIGNED, "p.grad.data=torch.zeros_like(p)", True),
        (GRAD_ASSIGNED, "g = p.grad; torch.autograd.grad(y, x); p.grad is None; p.grad == g", False),
        (GRAD_ASSIGNED, "x.requires_grad = True; p.grad.data.norm()", False),
        (ZEROING_VALUE, "torch.zeros_like(p.grad)", True),
        (ZEROING_VALUE, "0 * g", True),
        (ZEROING_VALUE, "g * 0.0", True),
        (ZEROING_VALUE, "g*0x0", True),
        (ZEROING_VALUE, "g * .0e3", True),
        (ZEROING_VALUE, "(0_0)  # none\n  * g", True),
        (ZEROING_VALUE, "g * (\n    0  # none\n)", True),
        (ZEROING_VALUE, "g * 10; g * 0.5; 1.0 * g; g * a0; x = 0; y = 2 * 3", False),
        (word("grad"), "p. grad = None", True),
        (word("grad"), "x.requires_grad_(); torch.no_grad(); y.grad_fn", False),
        (call_of("zero_grad"), "model.zero_grad(set_to_none=False)", True),
        (call_of("zero_grad"), "zero_grad = True", False),
        (SCALER, "self.SCALER.step(opt)", True),
        (SCALER, "amp.GradScaler()", True),
        (FREEZES, "p.requires_grad = False", True),
        (FREEZES, "(p).requires_grad \\\n    = False", True),
        (FREEZES, "backbone.requires_grad_(False)", True),
        (FREEZES, "backbone.requires_grad_( requires_grad=False )", True),
        (FREEZES, "nn.Parameter(w, requires_grad=False); p.requires_grad = True; p.requires_grad == False", False),
    ],
)
def test_tokens(token, text, present):
    assert might_fire(text, [type("R", (), {"needs": (token,)})]) is present


def test_a_grad_assignment_passes_gl005_only_beside_a_zeroing_value():
    from gradlint.rules.clearing import GradsKeptAllocated

    assert might_fire("for p in params:\n    p.grad = 0 * p.grad\n", [GradsKeptAllocated])
    assert might_fire("for p in params:\n    p.grad.data = torch.zeros_like(p.grad)\n", [GradsKeptAllocated])
    assert not might_fire("for p in params:\n    p.grad = g.clone()\n    p.grad = None\n", [GradsKeptAllocated])


def test_the_release_rules_need_what_they_weigh_against_the_release_set_up():
    from gradlint.rules import RULES_BY_CODE

    hook_only = "p.register_post_accumulate_grad_hook(hook)\nout = model(x)\n"
    assert not any(might_fire(hook_only, [RULES_BY_CODE[code]]) for code in ("GL201", "GL202", "GL203"))
    assert might_fire(hook_only + "scaler = torch.amp.GradScaler()\n", [RULES_BY_CODE["GL201"]])
    assert might_fire(hook_only + "with torch.autocast('cuda'):\n    pass\n", [RULES_BY_CODE["GL201"]])
    assert might_fire(hook_only + "cfg = dict(gradient_accumulation_steps=4)\n", [RULES_BY_CODE["GL202"]])
    assert might_fire(hook_only + "loss.backward()\nmodel.zero_grad()\n", [RULES_BY_CODE["GL202"]])
    assert not might_fire(hook_only + "loss.backward()\n", [RULES_BY_CODE["GL202"]])
    assert might_fire(hook_only + "torch.nn.utils.clip_grad_norm_(params, 1.0)\n", [RULES_BY_CODE["GL203"]])


def test_a_parsed_file_is_checked_only_by_the_rules_whose_tokens_it_holds(monkeypatch, tmp_path):
    from gradlint.rules.parameters import OptimizerOverFrozenParams

    def crash(self, model):
        raise RuntimeError("ran")

    monkeypatch.setattr(OptimizerOverFrozenParams, "check", crash)
    loop = "for x in data:\n    loss(x).backward()\n    opt.step()\n"
    frozen = "model.requires_grad_(False)\nopt = SGD(model.parameters())\n" + loop
    assert lint_text(loop, "loop.py").error is None
    assert "GL009" in lint_text(frozen, "frozen.py").error
    assert "GL009" in lint_text(loop, "loop.py", prefilter=False).error
    (tmp_path / "loop.py").write_text(loop)
    (tmp_path / "frozen.py").write_text(frozen)
    errors = {os.path.basename(r.path): r.error for r in runner.run([str(tmp_path)], Config(root=tmp_path), jobs=1)}
    assert errors["loop.py"] is None and "GL009" in errors["frozen.py"]


def test_tuple_tokens_need_all_their_parts():
    rule = type("R", (), {"needs": ((BACKWARD, STEP),)})
    assert not might_fire("loss.backward()\n", [rule])
    assert might_fire("loss.backward()\nopt.step()\n", [rule])
    assert needed_tokens([rule, rule]) == ((BACKWARD, STEP),)


def test_files_the_prefilter_rejects_are_never_parsed(tmp_path, monkeypatch):
    parsed = []
    real = linter.parse  # the runner parses through linter.parse_and_check
    monkeypatch.setattr(linter, "parse", lambda text, *tree: parsed.append(text) or real(text, *tree))
    for i in range(30):
        (tmp_path / f"model{i}.py").write_text("import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    (tmp_path / "train.py").write_text("for x in data:\n    loss(x).backward()\n    opt.step()\n")
    results = runner.run([str(tmp_path)], Config(root=tmp_path), jobs=1)
    assert len(parsed) == 1 and "opt.step()" in parsed[0]
    assert [f.code for r in results for f in r.findings] == ["GL001"]


# --------------------------------------------------------------------------- real packages

# Pure-Python packages with training code, optimizers and schedulers in them;
# CI sweeps a smaller set.
SWEEP_PACKAGES = ["accelerate==1.15.0"] if os.environ.get("CI") else ["accelerate==1.15.0", "timm==1.0.31", "torchtune==0.6.1"]


@pytest.fixture(scope="module")
def package_sources(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheels")
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(folder), *SWEEP_PACKAGES],
        capture_output=True,
        text=True,
    )
    if download.returncode != 0:
        pytest.skip(f"cannot download {SWEEP_PACKAGES}: {download.stderr.strip().splitlines()[-1:]}")
    sources = tmp_path_factory.mktemp("sources")
    for wheel in folder.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(sources)
    return sources


@pytest.mark.slow
def test_prefilter_changes_nothing_on_real_packages(package_sources):
    files = sorted(package_sources.rglob("*.py"))
    assert len(files) > 50  # accelerate alone (CI) has about 80
    rejected = 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if might_fire(text, ALL_RULES):
            continue  # checked the same way with and without the prefilter
        rejected += 1
        assert outcome(lint_text(text, str(path), EVERY_RULE, prefilter=False)) == (None, []), path
    assert rejected > len(files) // 2


def test_a_comment_of_many_hashes_after_a_dot_is_searched_quickly():
    # The gap between tokens may hold a comment; read as a whole to the line's end,
    # a comment of many "#" cannot make the search try every way of splitting it.
    text = "x = y.  " + "#" * 200 + "\n" * 3 + "p.grad = None\n"
    assert GRAD_ASSIGNED.search(text) is not None  # before: still searching after ten minutes
    assert call_of("step").search("opt.step  " + "#" * 200 + "\n") is None
    assert call_of("step").search("opt.step  # (\n") is None  # the "(" is inside the comment


# --------------------------------------------------------------------------- call tokens narrowed by Python's tree

LIBRARY = '''"""Functions in the style of a library: ``loss.backward()`` and ``opt.step()`` only in prose."""


def linear_backward(grad, weight):
    """The backward of a linear layer (see ``Tensor.backward()``)."""
    return grad @ weight


def step(x):
    return x + 1


for i in range(3):
    linear_backward(i, step(i))
'''


def test_call_tokens_need_a_real_call_where_pythons_tree_is_known(tmp_path, monkeypatch):
    from gradlint.prefilter import called_names, rules_that_might_fire

    tree = FiledTree(ast.parse(LIBRARY))
    assert might_fire(LIBRARY, ALL_RULES)  # the text alone lets it through: backward( and step( are spelled
    assert not rules_that_might_fire(LIBRARY, ALL_RULES, called_names(tree))
    parsed = []
    real = linter.parse
    monkeypatch.setattr(linter, "parse", lambda text, *tree: parsed.append(text) or real(text, *tree))
    assert lint_text(LIBRARY, "library.py").findings == [] and parsed == []
    (tmp_path / "library.py").write_text(LIBRARY)
    (tmp_path / "train.py").write_text("for x in data:\n    loss(x).backward()\n    opt.step()\n")
    results = runner.run([str(tmp_path)], Config(root=tmp_path), jobs=1)
    assert len(parsed) == 1 and "opt.step()" in parsed[0]
    assert [(os.path.basename(r.path), f.code) for r in results for f in r.findings] == [("train.py", "GL001")]


@pytest.mark.parametrize(
    "token, code, present",
    [
        (BACKWARD, "loss.backward()", True),
        (BACKWARD, "self.manual_backward(loss)", True),
        (BACKWARD, "from torch.autograd import backward as bw\nbw(loss)", True),
        (BACKWARD, "graph.replay()  # backward(", True),
        (BACKWARD, "def linear_backward(g): pass\nlinear_backward(g)", False),
        (BACKWARD, "x = loss.backward  # backward()", False),
        (STEP, "opt.step()", True),
        (STEP, "xm.optimizer_step(opt)", True),
        (STEP, "trainer.optimize(self.optimizer)  # step(", True),  # a function of another file may step it
        (STEP, "def step(self): pass  # step(", False),
        (STEP, "run(options)  # step(", False),
        (call_of("zero_grad"), "model.zero_grad(set_to_none=False)", True),
        (call_of("zero_grad"), "def zero_grad(self): pass", False),
    ],
)
def test_call_tokens_on_pythons_tree(token, code, present):
    from gradlint.prefilter import called_names, rules_that_might_fire

    rule = type("R", (), {"needs": (token,)})
    assert might_fire(code, [rule])  # every case spells the call in its text
    assert bool(rules_that_might_fire(code, [rule], called_names(FiledTree(ast.parse(code))))) is present
