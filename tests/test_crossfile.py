"""Several modules of one package checked as one run: a step function whose loop lives in another file.

Each folder of ``fixtures/crossfile`` is one run; its files report exactly
the findings their ``# expect:`` markers name. The cache keys a file's result
by what the other files of the run say about it, and a file checked alone
(the flake8 plugin, ``lint_file``) sees only its own loops.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from fixture_markers import CROSSFILE, crossfile_cases, expected_findings
from gradlint import runner
from gradlint.cache import Cache
from gradlint.config import Config
from gradlint.linter import lint_file

CASES = crossfile_cases()


def _found(results, root):
    return {(str(Path(r.path).relative_to(root)), f.line, f.code) for r in results for f in r.findings}


def _expected(root):
    return {(str(p.relative_to(root)), line, code) for p in sorted(root.rglob("*.py")) for line, code in expected_findings(p.read_text())}


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_case_reports_exactly_its_markers(case):
    results = runner.run([str(case)], Config(root=case), jobs=1)
    assert all(r.error is None for r in results), [r.error for r in results]
    assert _found(results, case) == _expected(case)


@pytest.mark.parametrize("case", [c for c in CASES if _expected(c)], ids=lambda p: p.name)
def test_each_code_selected_alone_still_reports_its_markers(case):
    """The prefilter must let a file through on the selected rule's own tokens, whatever the other rules need."""
    for code in sorted({code for _, _, code in _expected(case)}):
        results = runner.run([str(case)], dataclasses.replace(Config(root=case), select=(code,)), jobs=1)
        assert _found(results, case) == {e for e in _expected(case) if e[2] == code}, code


def test_there_are_buggy_cases_and_correct_twins():
    buggy = [c for c in CASES if _expected(c)]
    assert len(buggy) >= 2 and len(CASES) - len(buggy) >= 2


def test_a_step_module_checked_alone_does_not_see_the_loop_of_another():
    trainer = CROSSFILE / "step_method_in_trainer_module" / "trainer.py"
    assert lint_file(str(trainer)).findings == []


def test_a_changed_caller_changes_the_cached_result_of_the_step_module(tmp_path):
    case = tmp_path / "pkg"
    shutil.copytree(CROSSFILE / "step_method_in_trainer_module", case)
    config = Config(root=case)
    cache_dir = tmp_path / ".gradlint_cache"
    first = runner.run([str(case)], config, jobs=1, cache=Cache(cache_dir))
    assert [f.code for r in first for f in r.findings] == ["GL001"]
    engine = case / "engine.py"
    engine.write_text(engine.read_text().replace("            loss = trainer.train_step(batch)", "            trainer.optimizer.zero_grad()\n            loss = trainer.train_step(batch)"))
    second = runner.run([str(case)], config, jobs=1, cache=Cache(cache_dir))
    assert [f.code for r in second for f in r.findings] == []
    engine.write_text((CROSSFILE / "step_method_in_trainer_module" / "engine.py").read_text())
    third_cache = Cache(cache_dir)
    third = runner.run([str(case)], config, jobs=1, cache=third_cache)
    assert [f.code for r in third for f in r.findings] == ["GL001"]
    assert third_cache.hits == 3  # every result comes from the cache: the first run's, keyed by the same context


TRAINER = '''import torch


class Trainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(self, batch):
        self.model(batch).sum().backward()
        self.optimizer.step()
'''
LOOP = '''def main(model, loader):
    trainer = Trainer(model)
    for batch in loader:
        trainer.train_step(batch)
'''


def test_scripts_beside_each_other_decide_for_each_other_only_when_one_imports_the_other(tmp_path):
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "unrelated.py").write_text("from somewhere import Trainer\n\n\n" + LOOP)
    results = runner.run([str(tmp_path)], Config(root=tmp_path), jobs=1)
    assert [f.code for r in results for f in r.findings] == []
    (tmp_path / "train.py").write_text("from trainer import Trainer\n\n\n" + LOOP)
    results = runner.run([str(tmp_path)], Config(root=tmp_path), jobs=1)
    assert [(Path(r.path).name, f.code) for r in results for f in r.findings] == [("trainer.py", "GL001")]


def test_worker_processes_give_the_same_findings(monkeypatch):
    monkeypatch.setattr(runner, "MIN_PARALLEL_CHARS", 0)
    one = runner.run([str(CROSSFILE)], Config(root=CROSSFILE), jobs=1)
    two = runner.run([str(CROSSFILE)], Config(root=CROSSFILE), jobs=2)
    assert [(r.path, r.findings) for r in one] == [(r.path, r.findings) for r in two]
    assert sum(len(r.findings) for r in two) >= 2


def test_fix_applies_to_a_step_module_whose_loop_is_in_another_file(tmp_path):
    from gradlint.fixer import fix_paths

    case = tmp_path / "pkg"
    shutil.copytree(CROSSFILE / "step_method_in_trainer_module", case)
    outcomes = fix_paths([str(case)], Config(root=case))
    fixed = {Path(o.path).name: o for o in outcomes}
    assert fixed["trainer.py"].fixed == 1
    assert fixed["trainer.py"].result.findings == []
    text = (case / "trainer.py").read_text()
    assert "        self.optimizer.step()  # expect: GL001\n        self.optimizer.zero_grad()\n" in text
    assert runner.run([str(case)], Config(root=case), jobs=1)[-1].findings == []


def test_a_file_notes_the_calls_it_hands_a_wrapped_model():
    from gradlint.project_index import scan_calls

    text = (
        "from torch.nn.parallel import DistributedDataParallel as NativeDDP\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from megatron_fsdp import fully_shard as megatron_shard\n"
        "def main(model, opt, loader, accelerator):\n"
        "    ddp = NativeDDP(model)\n"
        "    run(opt, ddp)\n"
        "    net, opt, loader = accelerator.prepare(model, opt, loader)\n"
        "    engine.fit(model=net, loader=loader)\n"
        "    fully_shard(model)\n"
        "    evaluate(model)\n"
        "    megatron_shard(other)\n"
        "    run_other(other)\n"
        "    plain(opt, loader)\n"
    )
    assert scan_calls(text).passes_wrapped == {"run:1:ddp", "fit:model:accelerate", "evaluate:0:fsdp2"}


def test_a_function_handed_a_wrapped_model_learns_it_only_from_its_own_unit(tmp_path):
    case = tmp_path / "pkg"
    shutil.copytree(CROSSFILE / "ddp_wrapped_in_main_accumulates_in_engine", case)
    engine = str(case / "engine_finetune.py")
    together = runner.run([str(case)], Config(root=case), jobs=1)
    assert [f.code for r in together if r.path == engine for f in r.findings] == ["GL302"]
    (case / "main_finetune.py").write_text((case / "main_finetune.py").read_text().replace("from engine_finetune import", "from other_engine import"))
    apart = runner.run([str(case)], Config(root=case), jobs=1)
    assert [f.code for r in apart if r.path == engine for f in r.findings] == []


def test_a_unit_without_a_file_to_check_is_never_parsed_by_python(tmp_path, monkeypatch):
    """Only the units that hold a file the prefilter lets through have their loops read (the others cannot matter)."""
    from gradlint import project_index

    scanned = []
    real = project_index.scan_calls
    monkeypatch.setattr(runner, "scan_calls", lambda text, *tree: scanned.append(text) or real(text, *tree))
    library = tmp_path / "library"
    library.mkdir()
    (library / "__init__.py").write_text("")
    for i in range(5):
        (library / f"helpers{i}.py").write_text(f"def helper{i}(batch):\n    for x in batch:\n        yield x\n")
    package = tmp_path / "pkg"
    shutil.copytree(CROSSFILE / "step_method_in_trainer_module", package)
    results = runner.run([str(tmp_path)], Config(root=tmp_path), jobs=1)
    assert [(Path(r.path).name, f.code) for r in results for f in r.findings] == [("trainer.py", "GL001")]
    read = {text for text in scanned}
    assert read == {p.read_text() for p in package.rglob("*.py")}  # engine.py is read though never checked
    assert not any("def helper" in text for text in read)


def test_reading_only_the_statements_near_an_optimizer_argument_finds_what_reading_everything_finds(monkeypatch):
    """:func:`project_index._near_lines` skips most of a file; on every shipped file it finds what the whole walk finds."""
    import ast

    from gradlint import project_index

    def everything(tree, lines, functions):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append(node)
            yield node

    root = Path(__file__).resolve().parent.parent
    texts = [p.read_text(encoding="utf-8") for folder in ("fixtures", "examples") for p in sorted((root / folder).rglob("*.py"))]
    texts.append("def f(self, optimizer):  # comments\n    run(  # here\n        self.opt,\n    )\n    optimizer.step()\n")
    near = [project_index.scan_calls(text) for text in texts]
    monkeypatch.setattr(project_index, "_near_lines", everything)
    whole = [project_index.scan_calls(text) for text in texts]
    assert near == whole
    assert sum(1 for calls in near if calls.hands) > 10  # not vacuous: files that hand an optimizer on


def test_a_file_notes_the_calls_it_hands_a_scaler():
    from gradlint.project_index import scan_calls

    text = (
        "def train_step(self, batch):\n"
        "    self.updater.step(loss, grad_scaler=self.grad_scaler)\n"
        "    self.log(loss, scaler_state)\n"
        "    finish(optimizer, scaler)\n"
        "    evaluate(model)\n"
    )
    assert scan_calls(text).hands_scaler == {"step", "log", "finish"}


def test_a_file_notes_its_functions_and_classes_that_set_gradient_release_up():
    from gradlint.project_index import scan_calls

    text = (
        "import torch\n"
        "from torchtune import training\n"
        "def with_torchtune(model, optim_dict):\n"
        "    training.register_optim_in_bwd_hooks(model=model, optim_dict=optim_dict)\n"
        "def with_hook(model, optimizers):\n"
        "    def step_one(p):\n"
        "        optimizers[p].step()\n"
        "    for p in model.parameters():\n"
        "        p.register_post_accumulate_grad_hook(step_one)\n"
        "def logging_hooks(model):\n"
        "    for p in model.parameters():\n"
        "        p.register_post_accumulate_grad_hook(lambda q: print(q.grad.norm()))\n"
        "class InBackward:\n"
        "    def __init__(self, params):\n"
        "        self._optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in params}\n"
        "        for p in params:\n"
        "            p.register_post_accumulate_grad_hook(lambda param=p: self._step_and_clear(param))\n"
        "    def _step_and_clear(self, param):\n"
        "        self._optimizers[param].step()\n"
    )
    assert scan_calls(text).releases == {"with_torchtune", "with_hook", "__init__", "InBackward"}


def test_a_file_notes_the_callbacks_it_runs_while_the_gradients_are_scaled():
    from gradlint.project_index import scan_calls

    text = (
        "class Engine:\n"
        "    def after_backward(self):\n"
        "        for hook in self._hooks:\n"
        "            hook.after_backward(self)\n"
        "    def run(self, loader):\n"
        "        for batch in loader:\n"
        "            self.call_hook('before_iter')\n"
        "            self.scaler.scale(loss).backward()\n"
        "            self.after_backward()\n"
        "            self.call_hook('after_scaled_backward')\n"
        "            self.scaler.unscale_(self.optimizer)\n"
        "            self.call_hook('after_unscale')\n"
        "            self.scaler.step(self.optimizer)\n"
        "            self.scaler.update()\n"
    )
    assert scan_calls(text).scaled_dispatch == {"after_backward:run", "after_scaled_backward:run"}


def test_a_release_helper_of_another_module_is_seen_only_with_its_module(tmp_path):
    case = tmp_path / "pkg"
    shutil.copytree(CROSSFILE / "release_set_up_by_helper_in_another_module", case)
    together = runner.run([str(case)], Config(root=case), jobs=1)
    assert sorted(f.code for r in together for f in r.findings) == ["GL202", "GL203"]
    assert lint_file(str(case / "trainer.py")).findings == []  # alone, the helper is code it cannot see
    (case / "fused.py").write_text((case / "fused.py").read_text().replace("optimizers[param].step()", "print(param.grad.norm())"))
    apart = runner.run([str(case)], Config(root=case), jobs=1)
    assert [f.code for r in apart for f in r.findings] == []  # a hook that steps nothing releases nothing


_HELPER = """
import torch


class Scaler:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, update_grad=True):
{body}
"""


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        # backward on every call, step only under the flag: a backward helper
        ("        self._scaler.scale(loss).backward()\n        if update_grad:\n            self._scaler.step(optimizer)\n",
         "0=loss,1=optimizer,2=update_grad,True,scaled,whole,-1="),
        # a step outside the flag's branch: it steps on every call
        ("        loss.backward()\n        optimizer.step()\n", None),
        # a way out before the backward: it may not backpropagate
        ("        if loss is None:\n            return\n        loss.backward()\n        if update_grad:\n            optimizer.step()\n", None),
        # the backward only under a condition
        ("        if update_grad:\n            loss.backward()\n            optimizer.step()\n", None),
    ],
)
def test_a_backward_helper_backpropagates_on_every_call_and_steps_only_under_its_flag(body, shape):
    from gradlint.project_index import scan_calls

    facts = scan_calls(_HELPER.format(body=body)).backward_helpers
    assert facts == (frozenset({f"Scaler():{shape}"}) if shape else frozenset())


@pytest.mark.parametrize(
    ("source", "shape"),
    [
        # builds its loss, divides it by a parameter and backpropagates it: a backward-only helper
        ("def micro_step(log_probs, mask, accum):\n    loss = (log_probs * mask).mean() / accum\n    loss.backward()\n"
         "    return loss\n", "-1=,-1=,-1=,,plain,divides,2=accum"),
        # backpropagates the loss it is handed, undivided
        ("def backprop(loss):\n    loss.backward()\n", "0=loss,-1=,-1=,,plain,whole,-1="),
        # a scaled backward of a local loss divided by two parameters: no one divisor to name
        ("def micro_step(x, scaler, a, b):\n    loss = x.mean() / a / b\n    scaler.scale(loss).backward()\n",
         "-1=,-1=,-1=,,scaled,divides,-1="),
        # it also steps: a train step, not a backward-only helper
        ("def train_step(model, x, opt):\n    loss = model(x)\n    loss.backward()\n    opt.step()\n", None),
        ("def train_step(model, x, lr):\n    loss = model(x)\n    loss.backward()\n    model.optim.step()\n", None),
        # it clips: more than a backward
        ("def micro_step(model, x):\n    model(x).backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1)\n", None),
        # a way out before the backward, or the backward only under a condition
        ("def micro_step(x):\n    if x is None:\n        return\n    x.mean().backward()\n", None),
        ("def micro_step(loss, do):\n    if do:\n        loss.backward()\n", None),
    ],
)
def test_a_module_function_that_only_backpropagates_is_a_backward_helper(source, shape):
    from gradlint.project_index import scan_calls

    name = source.split("(", 1)[0].removeprefix("def ")
    facts = scan_calls("import torch\n\n\n" + source).backward_helpers
    assert facts == (frozenset({f"{name}:{shape}"}) if shape else frozenset())


def test_a_backward_only_helper_is_known_where_a_loop_calls_it(tmp_path):
    """The fact reaches a file whose loop calls the helper, and no file that only defines or mentions it."""
    from gradlint.project_index import ProjectIndex, scan_calls

    files = {
        "utils.py": "def micro_step(x, accum):\n    loss = x.mean() / accum\n    loss.backward()\n    return loss\n",
        "train.py": "from utils import micro_step\n\n\ndef train(xs, opt):\n    for x in xs:\n        micro_step(x, 4)\n        opt.step()\n",
        "other.py": "from utils import micro_step\n\nSTEP = micro_step\n",
    }
    calls = {str(tmp_path / p): scan_calls(t) for p, t in files.items()}
    index = ProjectIndex(calls.items())

    def backs(name):
        path = str(tmp_path / name)
        return [c for c in index.context_of(path, calls[path]) if c.startswith("backs:")]

    assert backs("train.py") == ["backs:micro_step:-1=,-1=,-1=,,plain,divides,1=accum"]
    assert backs("other.py") == []


def test_a_helper_class_is_reached_only_through_names_bound_to_its_instances_alone(tmp_path):
    """``loss_scaler`` is a backward helper for the engine only while every assignment of a call to that name in the
    run builds the helper class; one bound to a GradScaler elsewhere leaves it unknown."""
    from gradlint.project_index import ProjectIndex, scan_calls

    helper = _HELPER.format(body="        loss.backward()\n        if update_grad:\n            optimizer.step()\n")
    engine = "def train(model, loader, optimizer, loss_scaler):\n    for i, x in enumerate(loader):\n        loss_scaler(model(x), optimizer, update_grad=i % 2 == 0)\n"
    main = "from engine import train\nfrom helper import Scaler\n\n\ndef main():\n    loss_scaler = Scaler()\n    train(None, [], None, loss_scaler)\n"
    other = "import torch\nfrom engine import train\n\n\ndef main():\n    loss_scaler = torch.cuda.amp.GradScaler()\n"
    files = {"helper.py": helper, "engine.py": engine, "main.py": main}

    def backs(extra):
        calls = {str(tmp_path / p): scan_calls(t) for p, t in {**files, **extra}.items()}
        index = ProjectIndex(calls.items())
        path = str(tmp_path / "engine.py")
        return [c for c in index.context_of(path, calls[path]) if c.startswith("backs:")]

    assert backs({}) == ["backs:loss_scaler:0=loss,1=optimizer,2=update_grad,True,plain,whole,-1="]
    assert backs({"other.py": other}) == []
