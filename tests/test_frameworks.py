"""The framework modules: what each declares, how the registry orders them, and that rules name none of them."""

from __future__ import annotations

import ast
import io
import pkgutil
import re
import tokenize
from pathlib import Path

import libcst as cst
import pytest

from gradlint import frameworks
from gradlint.build import build_model
from gradlint.events import EventKind
from gradlint.frameworks.framework import Framework
from gradlint.kinds import ObjKind

ROOT = Path(__file__).resolve().parent.parent
_SUPPORT = {"framework", "settings"}  # the package's modules that are no framework's
# Spellings that belong to one framework: a rule's code (outside its documentation) must ask the registry instead.
_FRAMEWORK_WORDS = re.compile(
    r"accelerat|lightning|fabric|deepspeed|\bapex\b|torchtune|optimi\b|transformers|\btrl\b|fairseq|megatron|opacus|"
    r"mmengine|torch_xla|\bddp\b|fsdp|sync_gradients|no_backward_sync|require_backward_grad_sync|"
    r"gradient_accumulation_steps|accumulate_grad_batches|num_items_in_batch|compute_loss|prepare_for_backward|"
    r"DistributedDataParallel|fully_shard|LightningModule|scale_wrt_gas|virtual_step|StableAdamW|manual_backward|"
    r"disable_allreduce|optimizer_accumulation|colossalai|GeminiOptimizer",
    re.IGNORECASE,
)


def _code_tokens(path: Path):
    """The names and strings of a module outside its documentation: docstrings, comments, a rule's ``name`` and ``summary``."""
    source = path.read_text(encoding="utf-8")
    documentation: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                documentation.update(range(body[0].lineno, body[0].end_lineno + 1))
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) in ("name", "summary") for t in statement.targets):
                    documentation.update(range(statement.lineno, statement.end_lineno + 1))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NAME, tokenize.STRING) and token.start[0] not in documentation:
            yield token.start[0], token.string


@pytest.mark.parametrize("path", sorted((ROOT / "rules").glob("*.py")), ids=lambda p: p.name)
def test_no_rule_module_names_a_framework_outside_its_documentation(path):
    named = [(line, text) for line, text in _code_tokens(path) if _FRAMEWORK_WORDS.search(text)]
    assert named == []


def test_the_word_check_sees_a_framework_in_a_rules_code(tmp_path):
    # The check above must be able to fail: a framework's spelling in code is caught, in a docstring it is not.
    module = tmp_path / "rule.py"
    module.write_text('"""Quiet inside ``accelerator.accumulate()``."""\n\nif event.framework == "deepspeed":\n    pass\n')
    assert [text for _, text in _code_tokens(module) if _FRAMEWORK_WORDS.search(text)] == ['"deepspeed"']


def test_every_framework_module_is_registered_and_says_what_it_does_and_where_that_was_read():
    modules = [m.name for m in pkgutil.iter_modules(frameworks.__path__) if m.name not in _SUPPORT]
    registered = {id(f) for f in frameworks.FRAMEWORKS}
    for name in modules:
        module = __import__(f"gradlint.frameworks.{name}", fromlist=["FRAMEWORK"])
        assert isinstance(module.FRAMEWORK, Framework), name
        assert id(module.FRAMEWORK) in registered, f"{name} is not in FRAMEWORKS"
        assert re.search(r"What (it does|they do) to gradients\.", module.__doc__) and "Where it was read:" in module.__doc__, name
    assert len(modules) == len(frameworks.FRAMEWORKS)


@pytest.mark.parametrize(
    ("method", "owner", "kind", "expected"),
    [
        ("backward", "fabric", ObjKind.PREPARER, "fabric"),  # a receiver's name wins over its kind
        ("backward", "engine", ObjKind.PREPARER, "deepspeed"),  # whichever framework names it
        ("backward", "acc", ObjKind.PREPARER, "accelerate"),  # then the kinds, in the registry's order
        ("backward", "deepspeed_opt", ObjKind.OPTIMIZER, "deepspeed"),  # a spelling before a later framework's kind
        ("backward", "opt", ObjKind.OPTIMIZER, None),  # an fp16 optimizer's: the loss goes through as it is
        ("manual_backward", "self", ObjKind.UNKNOWN, "lightning"),  # whatever the receiver
        ("backward", "loss", ObjKind.UNKNOWN, "no declaration"),
    ],
)
def test_a_backward_is_read_by_name_first_then_by_kind_in_the_registrys_order(method, owner, kind, expected):
    declared = frameworks.backward_of(method, owner, kind)
    assert (declared.by if declared is not None else "no declaration") == expected


def _backward(source: str):
    model = build_model(cst.parse_module(source))
    return next(e for root in model.roots for e in root.events if e.kind is EventKind.BACKWARD)


def test_the_registry_answers_for_an_events_framework_in_neutral_terms():
    divided = _backward("from accelerate import Accelerator\nacc = Accelerator()\nfor b in data:\n    acc.backward(f(b))\n")
    synced = _backward("for b in data:\n    model_engine.backward(f(b))\n")
    plain = _backward("for b in data:\n    f(b).backward()\n")
    assert (divided.framework, frameworks.divides_by_count(divided), frameworks.all_reduces_as_plain(divided)) == ("accelerate", True, True)
    assert (synced.framework, frameworks.divides_by_count(synced), frameworks.all_reduces_as_plain(synced)) == ("deepspeed", True, False)
    assert (plain.framework, frameworks.divides_by_count(plain), frameworks.all_reduces_as_plain(plain)) == (None, False, True)


def test_the_smallest_example_of_the_architecture_document_declares_a_framework():
    document = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = document[document.index("### How to add a framework"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("```\n", section.index("```python\n") + 10)]
    namespace: dict = {}
    exec(compile(code, "example.py", "exec"), namespace)  # noqa: S102 - the document's own example
    example = namespace["FRAMEWORK"]
    assert isinstance(example, Framework) and example.backwards[0].by == "trainkit"
    count = example.backwards[0].count
    assert count.own_count(cst.parse_expression("runner.accumulation"), "runner")
    assert count.divides_again.format(call="runner.backward") == "`runner.backward` divides it again (`Runner(accumulation=...)`)"


def test_the_backward_prefilter_token_names_every_frameworks_backward_method():
    """The prefilter's BACKWARD names are spelled out in gradlint/tokens.py (importing the registry there would load
    LibCST at start-up): they must stay the registry's backward methods, plus ``backward`` and a graph's ``replay``."""
    from gradlint.tokens import BACKWARD

    assert BACKWARD.names == frozenset({"backward", "replay", *frameworks.BACKWARD_METHODS})


def test_the_release_spellings_of_the_prefilter_are_the_release_walks():
    """The runner decides which files may set gradient release up for another file with gradlint/tokens.py's copy of
    the release walk's tokens (importing the registry there would load LibCST at start-up): they must stay equal."""
    from gradlint.release_setups import RELEASE_TOKENS
    from gradlint.tokens import RELEASE_SPELLINGS

    assert RELEASE_SPELLINGS.substrings == RELEASE_TOKENS  # in order: the runner compares them as tokens


@pytest.mark.parametrize(
    "call",
    [
        "Fabric(accelerator='cuda', devices=1, precision='bf16-mixed')",
        "Fabric(devices=[0], num_nodes=4)",
        "prepare_model(model, True, None)",
        "prepare_model(model, parallel_strategy=args.strategy, **kwargs)",
        "Accelerator(*args, fsdp_plugin=plugin, gradient_accumulation_steps=-2)",
    ],
)
def test_the_rules_and_the_project_index_read_a_calls_literal_arguments_alike(call):
    """A wrap's declarations judge a call's arguments on LibCST's tree (the rules) and on Python's (the project index):
    both readings must hand them the same values."""
    from gradlint.frameworks.framework import literal_arguments
    from gradlint.project_index import _literal_arguments

    on_libcst = literal_arguments(cst.parse_expression(call))
    on_python = _literal_arguments(ast.parse(call, mode="eval").body)
    assert on_libcst == on_python
    assert on_libcst  # every call above hands something


def test_fabric_is_one_process_only_for_one_device_on_one_node():
    from gradlint.frameworks.framework import literal_arguments
    from gradlint.frameworks.lightning import FRAMEWORK as LIGHTNING

    quiet = next(w for w in LIGHTNING.wraps if w.key == "fabric").quiet_when_built
    read = lambda code: quiet(literal_arguments(cst.parse_expression(code)))  # noqa: E731
    assert read("Fabric(devices=1)") and read("Fabric(accelerator='cpu', devices=[2], num_nodes=1)")
    assert not read("Fabric(devices=1, num_nodes=4)")
    assert not read("Fabric(devices=2)") and not read("Fabric(devices=n)") and not read("Fabric(devices=1, **cfg)")


def test_ray_trains_prepare_model_wraps_unless_asked_not_to_and_decides_in_the_forward_only_as_ddp():
    from gradlint.frameworks.framework import literal_arguments
    from gradlint.frameworks.ray_train import FRAMEWORK as RAY

    wrap = RAY.wraps[0]
    arguments = lambda code: literal_arguments(cst.parse_expression(code))  # noqa: E731
    assert not wrap.leaves_unwrapped(arguments("prepare_model(model)"))
    assert wrap.arms_in_forward(arguments("prepare_model(model)"))
    assert not wrap.arms_in_forward(arguments("prepare_model(model, parallel_strategy='fsdp')"))
    assert not wrap.leaves_unwrapped(arguments("prepare_model(model, parallel_strategy='fsdp')"))
    for unwrapped in ("prepare_model(model, parallel_strategy=None)", "prepare_model(model, True, False)",
                      "prepare_model(model, wrap_ddp=False)", "prepare_model(model, parallel_strategy=args.strategy)"):
        assert wrap.leaves_unwrapped(arguments(unwrapped)), unwrapped
