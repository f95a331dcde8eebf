"""Fix for GL204: rewrite a plain loop to gradient release.

By default the optimizer stays as it is and ``GradientRelease(opt)``
(``gradlint.runtime.release``) follows its construction: the optimizer's
steps run inside backward, in buckets of parameters through its fused kernel
where it has one, and its ``step()`` / ``zero_grad()`` become no-ops that end
the iteration. Its class, hyper-parameters, state dict and schedulers are
untouched. On a GPU this ran at 0.8x-1.2x the step of the loop as written
where a release stepping each parameter alone took 1.5x-2.1x
(docs/benchmarks-runtime.md).

A module that already imports torch-optimi gets optimi's release instead:
the ``torch.optim`` optimizer becomes its ``optimi`` twin built with
``gradient_release=True``, ``prepare_for_gradient_release(model, opt)``
follows it, and the loop's ``opt.step()`` / ``opt.zero_grad()`` go. Where
optimi's defaults differ from torch's, the torch value is written out so the
numbers stay the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from gradlint.events import EventKind
from gradlint.fixes.edits import AddImport, Edit, Fix, Insert, Remove, Replace, parse_statements
from gradlint.fixes.locate import code, statement_of
from gradlint.model import Event, LoopModel
from gradlint.parsed_file import ParsedFile
from gradlint.objects import last_name
from gradlint.syntax import callee_name, keyword_arg, method_name, receiver


@dataclasses.dataclass(frozen=True)
class _Equivalent:
    """How one ``torch.optim`` optimizer maps onto its optimi twin."""

    positional: tuple[str, ...]  # torch's parameters after ``params``, in order
    carried: dict[str, str]  # torch defaults optimi does not share (or lacks): written out when not given
    optimi_defaults: dict[str, str | None]  # what optimi would use instead (None: no default), for the message
    must_be: dict[str, tuple[str, ...]]  # torch options optimi lacks: allowed only at these literal values (then dropped)
    dropped: tuple[str, ...] = ("foreach", "fused")  # implementation switches with no effect on the numbers


_ADAM_FLAGS = {"amsgrad": ("False",), "maximize": ("False",), "capturable": ("False",), "differentiable": ("False",)}

EQUIVALENTS: dict[str, _Equivalent] = {
    "AdamW": _Equivalent(
        ("lr", "betas", "eps", "weight_decay", "amsgrad"),
        {"lr": "1e-3", "betas": "(0.9, 0.999)", "eps": "1e-8"},
        {"lr": None, "betas": "(0.9, 0.99)", "eps": "1e-6"},
        _ADAM_FLAGS,
    ),
    "Adam": _Equivalent(
        ("lr", "betas", "eps", "weight_decay", "amsgrad"),
        {"lr": "1e-3", "betas": "(0.9, 0.999)", "eps": "1e-8"},
        {"lr": None, "betas": "(0.9, 0.99)", "eps": "1e-6"},
        {**_ADAM_FLAGS, "decoupled_weight_decay": ("False",)},
    ),
    "SGD": _Equivalent(
        ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
        {"lr": "1e-3"},
        {"lr": None},
        {"dampening": ("0", "0.0"), "nesterov": ("False",), "maximize": ("False",), "differentiable": ("False",)},
    ),
}

_TORCH_MODULES = ("torch.optim.", "torch.optim.adam.", "torch.optim.adamw.", "torch.optim.sgd.")


def release_note(construction: cst.Call) -> str | None:
    """Which optimi defaults differ from torch's for this optimizer, for the finding's message."""
    name = callee_name(construction)
    equivalent = EQUIVALENTS.get(name or "")
    if equivalent is None:
        return None
    differences = ", ".join(
        f"no default {key}" if equivalent.optimi_defaults[key] is None else f"{key}={equivalent.optimi_defaults[key]}"
        for key in equivalent.carried
    )
    torch_values = ", ".join(f"{key}={value}" for key, value in equivalent.carried.items())
    return (
        f"optimi's {name} has {differences} where torch.optim's uses {torch_values}: the rewrite passes torch's values "
        f"explicitly; optimi also turns on Kahan summation for bf16/fp16 parameters (kahan_sum=False keeps torch's numbers there)"
    )


def find_construction(model: LoopModel, optimizer: str) -> cst.Call | None:
    """The one call that builds ``optimizer`` (``opt = torch.optim.AdamW(...)``), if the module shows exactly one."""
    found = model.index.constructions.get(last_name(optimizer), [])
    return found[0] if len(found) == 1 else None


def optimi_release(model: LoopModel, step: Event, zeros: Sequence[Event], construction: cst.Call) -> Fix | None:
    """The GL204 rewrite to torch-optimi for the optimizer built by ``construction`` and stepped at ``step``.

    None when the optimizer has no optimi equivalent; the fix's edits are
    None when the code is not shaped for a faithful rewrite (options optimi
    lacks, parameters not given as ``model.parameters()``, a step whose
    result is used, ...).
    """
    name = callee_name(construction)
    if name not in EQUIVALENTS:
        return None

    def build() -> list[Edit] | None:
        module = model.module
        if not _is_torch_optimizer(module, construction, name):
            return None
        assignment = statement_of(model.file, construction)
        if type(assignment) is not cst.Assign or assignment.value is not construction:
            return None
        args = _optimi_arguments(module, construction, EQUIVALENTS[name])
        owner = _parameter_owner(construction)
        removals = _loop_removals(model.file, step, zeros)
        if args is None or owner is None or removals is None:
            return None
        qualified = _name_taken(model, name) or _name_taken(model, "prepare_for_gradient_release")
        prefix = "optimi." if qualified else ""
        optimizer = code(module, assignment.targets[0].target)
        prepare = f"{prefix}prepare_for_gradient_release({code(module, owner)}, {optimizer})\n"
        new_func = cst.parse_expression(f"{prefix}{name}")
        return [
            AddImport("optimi", () if qualified else (name, "prepare_for_gradient_release")),
            Replace(construction, lambda node: node.with_changes(func=new_func, args=args)),
            Insert(assignment, parse_statements(prepare)),
            *removals,
        ]

    return Fix(f"rewrite to gradient release with optimi.{name}; {release_note(construction)}", build)


RELEASE_MODULE = "gradlint.runtime.release"


def gradlint_release(model: LoopModel, construction: cst.Call) -> Fix:
    """The GL204 rewrite that keeps the optimizer: ``GradientRelease(opt)`` right after the statement building it.

    Its edits are None unless ``construction`` builds a ``torch.optim``
    optimizer (LBFGS re-evaluates the loss in ``step()`` and cannot be
    released) assigned to one name or attribute.
    """

    def build() -> list[Edit] | None:
        module = model.module
        name = _torch_optimizer_class(module, construction)
        if name is None or name == "LBFGS":
            return None
        assignment = statement_of(model.file, construction)
        if type(assignment) is not cst.Assign or assignment.value is not construction or len(assignment.targets) != 1:
            return None
        optimizer = code(module, assignment.targets[0].target)
        qualified = _name_taken(model, "GradientRelease")
        release = f"{RELEASE_MODULE}.GradientRelease" if qualified else "GradientRelease"
        return [
            AddImport(RELEASE_MODULE, () if qualified else ("GradientRelease",)),
            Insert(assignment, parse_statements(f"{release}({optimizer})\n")),
        ]

    return Fix(
        "keep the optimizer and add `GradientRelease(optimizer)` (gradlint.runtime.release): its steps then run inside "
        "backward, in buckets through the fused kernel where it has one, and step()/zero_grad() become no-ops "
        "(the script then needs gradlint installed where it trains)",
        build,
    )


def release_fix(model: LoopModel, step: Event, zeros: Sequence[Event]) -> Fix | None:
    """The GL204 fix for the optimizer stepped at ``step``, found by its construction in the module.

    None when the module does not show one construction of that optimizer.
    gradlint's ``GradientRelease`` unless the module already imports
    torch-optimi and optimi's rewrite applies; then optimi's release, whose
    description names the defaults that differ.
    """
    construction = find_construction(model, step.target) if step.target else None
    if construction is None:
        return None
    if model.index.imports.imports("optimi"):
        fix = optimi_release(model, step, zeros, construction)
        if fix is not None and fix.edits() is not None:
            return fix
    return gradlint_release(model, construction)


def _is_torch_optimizer(module: cst.Module, construction: cst.Call, name: str) -> bool:
    """Whether the call builds ``torch.optim.<name>``, resolved through the module's imports."""
    return _torch_optimizer_class(module, construction) == name


def _torch_optimizer_class(module: cst.Module, construction: cst.Call) -> str | None:
    """The class of ``torch.optim`` the call builds (``AdamW``), resolved through the module's imports, or None."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    qualified = wrapper.resolve(QualifiedNameProvider).get(construction.func, set())
    if callable(qualified):  # newer LibCST resolves qualified names lazily
        qualified = qualified()
    for q in qualified:
        for prefix in _TORCH_MODULES:
            rest = q.name.removeprefix(prefix)
            if rest != q.name and rest.isidentifier() and rest[:1].isupper():
                return rest
    return None


def _optimi_arguments(module: cst.Module, call: cst.Call, equivalent: _Equivalent) -> list[cst.Arg] | None:
    """The optimi call's arguments: ``params`` first, torch's options as keywords, carried defaults, then ``gradient_release=True``."""
    kept: list[cst.Arg] = []
    given: set[str] = set()
    for position, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is None:
            if position == 0:
                kept.append(arg)
                continue
            if position > len(equivalent.positional):
                return None
            tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
            arg = arg.with_changes(keyword=cst.Name(equivalent.positional[position - 1]), equal=tight)
        keyword = arg.keyword.value
        if keyword == "params":
            kept.insert(0, arg)
            continue
        given.add(keyword)
        if keyword in equivalent.must_be:
            if code(module, arg.value) not in equivalent.must_be[keyword]:
                return None
        elif keyword not in equivalent.dropped:
            if keyword not in equivalent.positional:
                return None
            kept.append(arg)
    if not kept or (kept[0].keyword is not None and kept[0].keyword.value != "params"):
        return None
    added = [f"{key}={value}" for key, value in equivalent.carried.items() if key not in given]
    added.append("gradient_release=True")
    extra = list(cst.parse_expression(f"f({', '.join(added)})").args)
    return _with_commas(kept, extra, call.args[-1].comma if call.args else cst.MaybeSentinel.DEFAULT)


def _with_commas(kept: list[cst.Arg], extra: list[cst.Arg], trailing) -> list[cst.Arg]:
    """Join arguments the way the original call did: its separator between them, its trailing comma last."""
    separator = next((a.comma for a in kept[:-1] if type(a.comma) is cst.Comma), None)
    separator = separator or cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args = kept + extra
    return [a.with_changes(comma=separator if i < len(args) - 1 else trailing) for i, a in enumerate(args)]


def _parameter_owner(call: cst.Call) -> cst.BaseExpression | None:
    """``model`` when the optimizer is built from exactly ``model.parameters()``."""
    params = keyword_arg(call, "params") or (call.args[0] if call.args and call.args[0].keyword is None else None)
    value = params.value if params is not None else None
    if type(value) is cst.Call and method_name(value) == "parameters" and not value.args:
        return receiver(value)
    return None


def _loop_removals(parsed: ParsedFile, step: Event, zeros: Sequence[Event]) -> list[Edit] | None:
    """Remove the step and the ``zero_grad()`` calls: the hooks now do both."""
    removals: list[Edit] = []
    for event in (step, *zeros):
        call = event.node
        if event.kind is EventKind.ZERO and (event.manual or type(call) is not cst.Call):
            continue  # a hand-written clear is harmless with gradient release: leave it
        statement = statement_of(parsed, call)
        if type(statement) is not cst.Expr or statement.value is not call:
            return None  # the call's result is used: the loop needs a human
        removals.append(Remove(statement))
    return removals


def _name_taken(model: LoopModel, name: str) -> bool:
    """Whether a bare name is already used in the module (then optimi's is written ``optimi.<name>``)."""
    return name in model.index.variable_names
