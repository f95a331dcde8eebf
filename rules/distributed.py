"""Rules about distributed data-parallel training (GL302, GL303)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.frameworks import framework_settings
from gradlint.model import NO_SYNC, Event, LoopModel, Root
from gradlint.objects import ObjKind, last_name
from gradlint.queries import accumulation, steps_with_loops
from gradlint.rule import BACKWARD, STEP, Report, Rule
from gradlint.syntax import calls_in_evaluation_order, children, dotted_name, keyword_arg, number, positional_args, receiver, walk


class AccumulationWithoutNoSync(Rule):
    """A ``DistributedDataParallel`` model accumulates gradients but all-reduces them on every micro-batch.

    **Why it matters.** DDP all-reduces the gradients at the end of every
    backward. While accumulating, only the last micro-batch's all-reduce is
    needed; the others send the whole gradient over the network for
    nothing. The result is right, but every micro-batch pays for a full
    all-reduce.

    **Fix.** Run the micro-batches that do not step inside ``model.no_sync()``
    (or set ``model.require_backward_grad_sync = False`` for them; accelerate's
    ``accelerator.accumulate(model)`` and Lightning/Fabric's
    ``no_backward_sync`` do it for you).

    **Stays quiet when**

    - the micro-batches run inside ``no_sync()`` /
      ``require_backward_grad_sync = False``, or a framework syncs
      (accelerate, Lightning, Fabric, a DeepSpeed engine);
    - no DDP model is reachable from the loop's code (the DDP wrapper belongs
      to another function), or the loop forwards through the module the DDP
      model wraps rather than the DDP model itself.

    **Bad**::

        model = DistributedDataParallel(model)
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    **Good**::

        model = DistributedDataParallel(model)
        for i, (x, y) in enumerate(loader):
            boundary = (i + 1) % accum == 0
            with contextlib.nullcontext() if boundary else model.no_sync():
                (loss_fn(model(x), y) / accum).backward()
            if boundary:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "GL302"
    name = "accumulation-without-no-sync"
    summary = "a DDP model accumulates gradients without no_sync() on the micro-batches that do not step"
    severity = Severity.WARNING
    fix = None  # wrapping the non-stepping micro-batches in no_sync() restructures the loop: left to the author
    needs = ((BACKWARD, STEP, "DistributedDataParallel"),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        every_ddp = [name for name, info in model.objects.items() if info.kind is ObjKind.DDP_MODEL]
        if not every_ddp:
            return
        for root in model.roots:
            ddp = _ddp_models_seen_by(model, root, every_ddp)
            if not ddp:
                continue  # the DDP wrapper belongs to other code: this root's model is not DDP
            for step, loop in steps_with_loops(root):
                if NO_SYNC in root.kinds_in(loop):
                    continue
                acc = accumulation(root, step, loop)
                if acc is None:
                    continue
                if _forwards_around_ddp(model, acc.frame if acc.style == "micro_loop" else loop, ddp):
                    continue  # the micro-batches' forward is not the DDP model's: their backward all-reduces nothing
                for backward in acc.backwards:
                    if acc.style == "guard" and backward.inside(acc.frame):
                        continue  # the stepping micro-batch's backward must all-reduce
                    if _synced_for_you(backward):
                        continue
                    yield Report(
                        backward.node,
                        f"the DDP model `{ddp[0]}` all-reduces the gradients of this backward on every micro-batch, "
                        f"but `{step.target}` only steps {_where(model, acc)}: run the micro-batches that do not step "
                        f"inside `{ddp[0]}.no_sync()` (or set `require_backward_grad_sync = False` for them)",
                    )
                    break


def _ddp_models_seen_by(model: LoopModel, root: Root, every_ddp: list[str]) -> list[str]:
    """The DDP models code in ``root`` can reach: named in its function, assigned at module level, or ``self.`` attributes of its class."""
    index = model.index
    if index is None:
        return every_ddp
    named = {dotted_name(n) for n in walk(root.node) if isinstance(n, (cst.Name, cst.Attribute))}
    method = isinstance(root.node, cst.FunctionDef) and _in_class(index, root.node)
    module_level = index.assignments.get(None, {})
    return [
        name for name in every_ddp
        if name in named or name in module_level or (method and name.startswith("self."))
    ]


def _in_class(index, function: cst.FunctionDef) -> bool:
    while function is not None:
        if index.class_of.get(function):
            return True
        function = index.parent_function.get(function)
    return False


def _forwards_around_ddp(model: LoopModel, loop, ddp: list[str]) -> bool:
    """Whether the loop calls a model other than the DDP ones (the module a DDP model wraps, or a model an optimizer
    trains), and never a DDP model: its backward all-reduces nothing."""
    other_models = {model.info(name).wraps for name in ddp} | {m for sources in model.all_param_sources().values() for m in sources}
    other_models -= {None} | {last_name(name) for name in ddp}
    called = {dotted_name(node.func) for node in walk(loop.node) if isinstance(node, cst.Call)} - {None}
    if {last_name(c) for c in called} & {last_name(name) for name in ddp}:
        return False
    return any(last_name(c) in other_models for c in called)


def _synced_for_you(backward: Event) -> bool:
    """A backward whose framework decides when to all-reduce (accelerate, Lightning, Fabric, DeepSpeed)."""
    return backward.framework is not None or backward.with_context("no_sync") or backward.with_context("accumulate")


def _where(model: LoopModel, acc) -> str:
    if acc.style == "guard":
        return f"under the accumulation guard at line {model.line(acc.frame.node)}"
    return f"after the micro-batch loop at line {model.line(acc.frame.node)}"


# Casts that change every floating-point parameter's dtype, and the dtype each gives.
_CASTS = {"half": "float16", "bfloat16": "bfloat16", "double": "float64", "float": "float32"}
_DTYPES = {
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
}


@dataclasses.dataclass
class _Site:
    """A call of interest in one function, in program order, with the loops and branches around it."""

    order: int
    call: cst.Call
    loops: tuple[cst.CSTNode, ...]
    branches: tuple[cst.If, ...]


@dataclasses.dataclass
class _Wrap:
    site: _Site
    target: str | None  # the name the DDP model is assigned to
    wrapped: str | None  # the module it wraps


class DdpModelChangedAfterWrap(Rule):
    """A ``DistributedDataParallel`` model is moved to another device or cast after wrapping, or wrapped again and again in the loop.

    **Why it matters.** DDP's documentation says never to change a model's
    parameters after wrapping it: the constructor registers the all-reduce
    hooks on each parameter's gradient accumulator. Moving a parameter to
    another device or casting it to another dtype replaces its data, and
    autograd then gives it a new gradient accumulator
    (``VariableHooks::set_data`` resets it when the device or dtype
    changes): the hooks stay on the old one. ``model.cpu()`` then
    ``model.cuda()``, or ``model.double()`` then ``model.float()``, leaves a
    model that trains but never all-reduces again; each replica drifts on
    its own data, silently. (Measured with torch 2.13 and gloo: after
    ``.double()`` / ``.float()`` on a wrapped model two ranks' parameters
    differ after three steps; without it they are identical.) Wrapping the
    model inside the training loop nests a DDP in a DDP on every pass, or
    leaves the iterations before the wrap unsynchronised.

    **Fix.** Move and cast the model before wrapping it, and wrap it once,
    before the training loop. To evaluate on the CPU, copy the module
    (``copy.deepcopy(model.module).cpu()``) instead of moving it.

    **Bad**::

        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model.cuda(rank), device_ids=[rank])
        for epoch in range(epochs):
            for x, y in loader:
                loss_fn(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            model.cpu()
            evaluate(model.module, val_loader)
            model.cuda(rank)

    **Good**::

        import copy

        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model.cuda(rank), device_ids=[rank])
        for epoch in range(epochs):
            for x, y in loader:
                loss_fn(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            evaluate(copy.deepcopy(model.module).cpu(), val_loader)

    **Stays quiet when** the move may keep the device (``.cuda()``,
    ``.to(device)``: only ``.cpu()`` of a model that was visibly put on a GPU
    before wrapping, or given ``device_ids``, is a sure change); the cast is to
    the dtype the model was already cast to before wrapping (``.float()``
    counts only after an earlier cast to another dtype); nothing trains after
    the change (no backward follows it, in the same function or a helper it
    calls, nor runs in a loop around it); the model is wrapped under a
    condition that may hold once (``if epoch == start_epoch:``, ``is None``)
    or wraps ``model.module`` again (re-wrapping after changing the model is
    what DDP asks for).
    """

    code = "GL303"
    name = "ddp-model-changed-after-wrap"
    summary = "a DDP model is moved to another device or cast after wrapping, or wrapped inside the training loop"
    severity = Severity.ERROR
    fix = None  # where to move, cast or wrap depends on the whole script
    needs = (("DistributedDataParallel", BACKWARD),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        wraps = {id(call) for call in framework_settings(model).ddp_wraps}
        if not wraps:
            return
        roots = {id(root.node): root for root in model.roots}
        for scope in _scopes(model.module):
            sites = _Sites(scope, wraps)
            if not sites.wraps:
                continue
            trains = _Training(roots.get(id(scope)), sites)
            yield from self._changes(model, sites, trains)
            yield from self._wraps_in_loop(model, sites, trains)

    def _changes(self, model: LoopModel, sites: "_Sites", trains: "_Training") -> Iterator[Report]:
        for wrap in sites.wraps:
            names = _names_after(wrap)
            before = [s for s in sites.moves if s.order < wrap.site.order and dotted_name(receiver(s.call)) in _names_before(wrap)]
            on_gpu = _on_gpu(wrap.site.call, before)
            casts_before = {_dtype_of(s.call) for s in before} - {None}
            for site in sites.moves:
                if site.order <= wrap.site.order or dotted_name(receiver(site.call)) not in names:
                    continue
                change = _change(site.call, on_gpu, casts_before)
                if change is None or not trains.after(site):
                    continue
                yield Report(
                    site.call,
                    f"`{model.code(site.call)}` {change} the DDP model wrapped at line {model.line(wrap.site.call)}: "
                    f"its parameters get new gradient accumulators and DDP's all-reduce hooks stay on the old ones, so "
                    f"its gradients are no longer all-reduced; move or cast the model before wrapping it",
                )

    def _wraps_in_loop(self, model: LoopModel, sites: "_Sites", trains: "_Training") -> Iterator[Report]:
        for wrap in sites.wraps:
            site = wrap.site
            loop = next((l for l in reversed(site.loops) if trains.in_loop(l)), None)
            if loop is None or wrap.target is None or wrap.target != wrap.wrapped:
                continue  # ``ddp = DDP(model)`` or ``model = DDP(model.module)``: a fresh wrap of the plain module
            inside = [b for b in site.branches if _within(b, loop)]
            if not inside:
                reason = "wraps the already wrapped model again on every iteration"
            elif any(_repeats(b.test) for b in inside):
                reason = "runs on several iterations: each wraps the already wrapped model again"
            elif all(_once_after_start(b.test) for b in inside):
                reason = "runs on one later iteration only: the iterations before it train without synchronising"
            else:
                continue
            yield Report(
                site.call,
                f"`{model.code(site.call)}` inside the training loop at line {model.line(loop)} {reason}; wrap the "
                f"model once, before the loop",
            )


def _scopes(module: cst.Module) -> Iterator[cst.CSTNode]:
    """The module and every function in it."""
    yield module
    for node in walk_all(module):
        if isinstance(node, cst.FunctionDef):
            yield node


def walk_all(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every statement-level node, nested functions and classes included (expressions are not entered)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if not isinstance(current, cst.BaseExpression):
            stack.extend(reversed(children(current)))


class _Sites:
    """The wraps, moves and casts of one function, in program order, with their loops and branches."""

    def __init__(self, scope: cst.CSTNode, wrap_calls: set[int]) -> None:
        self.wraps: list[_Wrap] = []
        self.moves: list[_Site] = []
        self.order_of: dict[int, int] = {}
        self._wrap_calls = wrap_calls
        self._count = 0
        self._block(scope.body if isinstance(scope, cst.Module) else _suite(scope.body), (), ())

    def _block(self, statements, loops, branches) -> None:
        for statement in statements:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.BaseSmallStatement):  # a one-line suite: ``if last: model.cpu()``
                self._small(statement, loops, branches)
            elif isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self._small(small, loops, branches)
            elif isinstance(statement, cst.If):
                self._expression(statement.test, loops, branches)
                self._block(_suite(statement.body), loops, branches + (statement,))
                orelse = statement.orelse
                if isinstance(orelse, cst.If):
                    self._block([orelse], loops, branches + (statement,))
                elif orelse is not None:
                    self._block(_suite(orelse.body), loops, branches + (statement,))
            elif isinstance(statement, (cst.For, cst.While)):
                self._expression(statement.iter if isinstance(statement, cst.For) else statement.test, loops, branches)
                self._block(_suite(statement.body), loops + (statement,), branches)
                if statement.orelse is not None:
                    self._block(_suite(statement.orelse.body), loops, branches)
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    self._expression(item.item, loops, branches)
                self._block(_suite(statement.body), loops, branches)
            elif isinstance(statement, cst.Try):
                self._block(_suite(statement.body), loops, branches)
                for handler in statement.handlers:
                    self._block(_suite(handler.body), loops, branches)
                for part in (statement.orelse, statement.finalbody):
                    if part is not None:
                        self._block(_suite(part.body), loops, branches)

    def _small(self, small: cst.BaseSmallStatement, loops, branches) -> None:
        self._expression(small, loops, branches)
        if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and id(small.value) in self._wrap_calls:
            wrap = next(w for w in reversed(self.wraps) if w.site.call is small.value)
            wrap.target = dotted_name(small.targets[-1].target)

    def _expression(self, node: cst.CSTNode, loops, branches) -> None:
        for call in calls_in_evaluation_order(node):
            self._count += 1
            self.order_of[id(call)] = self._count
            site = _Site(self._count, call, loops, branches)
            if id(call) in self._wrap_calls:
                args = positional_args(call)
                self.wraps.append(_Wrap(site, None, dotted_name(_unmoved(args[0].value)) if args else None))
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value in ("cpu", "cuda", "to", *_CASTS):
                self.moves.append(site)


def _suite(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    """The statements of an indented block, or the small statements of a one-line suite."""
    return suite.body


class _Training:
    """Where a function trains: the backwards it runs (its own and its helpers'), by order and by loop."""

    def __init__(self, root: Root | None, sites: _Sites) -> None:
        self._orders: list[int] = []
        self._loops: set[int] = set()
        if root is None:
            return
        for event in root.events_of(EventKind.BACKWARD):
            anchor = event.call_chain[0] if event.call_chain else event.node
            order = sites.order_of.get(id(anchor))
            if order is None:
                continue
            self._orders.append(order)
            self._loops.update(id(f.node) for f in event.loops)

    def after(self, site: _Site) -> bool:
        """Whether a backward runs after ``site``: later in the function, or in a loop around it."""
        return any(o > site.order for o in self._orders) or any(id(loop) in self._loops for loop in site.loops)

    def in_loop(self, loop: cst.CSTNode) -> bool:
        return id(loop) in self._loops


def _names_after(wrap: _Wrap) -> set[str]:
    """The names that reach the wrapped parameters after wrapping: the DDP model, its ``.module``, the module itself."""
    names = {n for n in (wrap.target, wrap.wrapped) if n}
    if wrap.target:
        names.add(f"{wrap.target}.module")
    return names


def _names_before(wrap: _Wrap) -> set[str]:
    return {wrap.wrapped} if wrap.wrapped else set()


def _unmoved(node: cst.BaseExpression) -> cst.BaseExpression:
    """``model`` for ``model.cuda(rank)`` / ``model.to(device)``: the module a wrap is given."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("cuda", "to", *_CASTS):
        node = node.func.value
    return node


def _on_gpu(wrap: cst.Call, before: list[_Site]) -> bool:
    """Whether the wrapped model visibly lives on a GPU: ``device_ids``, or ``.cuda()`` / ``.to("cuda...")`` before wrapping."""
    if keyword_arg(wrap, "device_ids") is not None or len(positional_args(wrap)) >= 2:
        return True
    args = positional_args(wrap)
    moved = [args[0].value] if args else []
    moved += [s.call for s in before]
    for node in moved:
        while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value == "cuda" or (node.func.attr.value == "to" and _names_cuda(node)):
                return True
            node = node.func.value
    return False


def _names_cuda(call: cst.Call) -> bool:
    """``.to("cuda")``, ``.to(f"cuda:{rank}")``, ``.to(torch.device("cuda", rank))``."""
    for arg in call.args:
        for node in walk(arg.value):
            if isinstance(node, (cst.SimpleString, cst.FormattedStringText)) and "cuda" in node.value:
                return True
    return False


def _dtype_of(call: cst.Call) -> str | None:
    """The dtype a cast gives: ``.half()`` → float16, ``.to(torch.bfloat16)`` → bfloat16."""
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
    if method in _CASTS and not call.args:
        return _CASTS[method]
    if method == "to":
        arg = keyword_arg(call, "dtype") or next(iter(positional_args(call)), None)
        name = dotted_name(arg.value) if arg is not None else None
        if name is not None and name.startswith("torch."):
            return _DTYPES.get(name.rsplit(".", 1)[-1])
    return None


def _change(call: cst.Call, on_gpu: bool, casts_before: set[str]) -> str | None:
    """What a move or cast after wrapping surely changes, in words; None when it may change nothing."""
    method = call.func.attr.value
    if method == "cpu":
        return "moves to the CPU" if on_gpu else None
    dtype = _dtype_of(call)
    if dtype is None or dtype in casts_before:
        return None
    if dtype == "float32" and not casts_before:
        return None  # most models are float32 already
    return f"casts to {dtype}"


def _within(branch: cst.If, loop: cst.CSTNode) -> bool:
    """Whether an ``if`` lies inside ``loop``'s body."""
    return any(n is branch for n in walk_all(loop.body))


def _repeats(test: cst.BaseExpression) -> bool:
    """A test that holds on several iterations: ``>``, ``>=``, ``%``, ``!=``."""
    for node in walk(test):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            return True
        if isinstance(node, cst.Comparison) and any(
            isinstance(c.operator, (cst.GreaterThan, cst.GreaterThanEqual, cst.NotEqual)) for c in node.comparisons
        ):
            return True
    return False


def _once_after_start(test: cst.BaseExpression) -> bool:
    """``epoch == 3``: a test that holds once, on an iteration that is visibly not the first."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    value = number(target.comparator)
    return isinstance(target.operator, cst.Equal) and value is not None and value > 0
