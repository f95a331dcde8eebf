"""Rules about gradient release, the fused backward and optimizer step (GL201–GL204).

Gradient release steps each parameter from a hook as soon as its gradient is
complete and frees the gradient at once. It saves the memory of every
gradient, and silently breaks everything that needs all gradients at once:
a ``GradScaler``, gradient accumulation, gradient-norm clipping.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from gradlint import frameworks
from gradlint.events import EventKind
from gradlint.findings import FixKind, Severity
from gradlint.model import GRAD_DIVIDE, HANDOFF, Event, Frame, FrameKind, LoopModel, Root
from gradlint.objects import ObjKind, last_name
from gradlint.queries import accumulation, blocks_entering, clears, frames_inside, home_loop, steps_with_loops
from gradlint.release_setups import RELEASE_TOKENS, Branch, ReleaseSetup, Site, runs_without_release
from gradlint.fixes.fuse_into_backward import release_fix
from gradlint.rule import BACKWARD, SCALER, STEP, AnyOf, Report, Rule
from gradlint.rules.clearing import GRAD_ASSIGNED, GRAD_ZEROED_BY_METHOD
from gradlint.syntax import callee_name, dotted_name, mentions, receiver, walk

# Prefilter: every release set-up contains one of RELEASE_TOKENS, and each rule also needs what it weighs
# against it: GL201 a scaler (named or built with "scaler" in any case) or an ``autocast``; GL202 an
# accumulation setting (a keyword argument containing "accum"), or a backward and a step or clear in one loop; GL203
# a clipping call (all contain "clip"). A clear is a call named like ``zero_grad``/``clear_grads`` or
# ``.grad`` zeroed or assigned.
RELEASE = AnyOf(*RELEASE_TOKENS)
_ACCUM = re.compile(r"accum\w*(?:[\s\\]|#[^\n]*(?![^\n]))*=(?!=)", re.IGNORECASE)  # a keyword argument
_CLEAR_CALL = re.compile(r"(?:zero|clear|reset)_?grad", re.IGNORECASE)  # the event builder's _CLEAR_HELPER, and zero_grad
_ACCUMULATES = tuple((RELEASE, BACKWARD, token) for token in (STEP, _CLEAR_CALL, GRAD_ZEROED_BY_METHOD, GRAD_ASSIGNED))


def _describe(model: LoopModel, setup: ReleaseSetup) -> str:
    """How a message names a set-up: what it is and where."""
    line = model.line(setup.node)
    callee = callee_name(setup.node) if type(setup.node) is cst.Call else None
    style = frameworks.RELEASE_STYLES.get(setup.style)
    if style is not None:  # a framework's set-up, in its words
        return style.describe(callee, line)
    if setup.style == "hook":
        return f"the optimizer step in the `register_post_accumulate_grad_hook` hook at line {line}"
    if setup.style == "apply_in_backward":
        return f"`_apply_optimizer_in_backward` at line {line}"
    if setup.style == "helper":
        return f"the gradient release `{callee}` sets up at line {line} (a function of another module that registers optimizer steps in backward)"
    return f"the optimizer-in-backward mode tested by `{model.code(setup.node)}` at line {line}"


def _function_of(root: Root) -> cst.FunctionDef | None:
    return root.node if type(root.node) is cst.FunctionDef else None


def _branches(event: Event) -> tuple[Branch, ...]:
    """The ``if``/``else`` sides around an event, as :func:`runs_without_release` reads them."""
    return _branches_of(event.frames)


def _branches_of(frames: tuple[Frame, ...]) -> tuple[Branch, ...]:
    return tuple((f.node.test, f.branch) for f in frames if f.kind is FrameKind.BRANCH and type(f.node) is cst.If and f.branch in ("if", "else"))


def released_roots(model: LoopModel) -> Iterator[tuple[Root, list[ReleaseSetup]]]:
    """Each root that runs together with a release set-up (hooks, which run per parameter, excluded)."""
    for root in model.roots:
        if root.node in model.release.hooks:
            continue
        setups = model.release.with_setup(_function_of(root))
        if setups:
            yield root, setups


def _released_sites(model: LoopModel, sites: list[Site]) -> Iterator[tuple[Site, ReleaseSetup]]:
    for site in sites:
        if site.function in model.release.hooks or runs_without_release(site.branches, model.release.flags):
            continue
        setups = model.release.with_setup(site.function)
        if setups:
            yield site, setups[0]


_NO_GRAD = frozenset({"no_grad", "inference_mode"})


def _may_make_gradients(model: LoopModel, site: Site) -> bool:
    """Whether what a float16 autocast block computes may be backpropagated: the block is under no ``torch.no_grad()``
    or ``inference_mode()``, and it backpropagates or returns, or a name it binds flows (through later assignments of
    its function) into a backward's receiver or arguments or into a ``return``. A validation block that only runs a
    pipeline (``image = pipeline(prompt).images[0]``) makes no gradient for a scaler to miss."""
    parents = model.parents or {}
    blocks = blocks_entering(model, site.node) if type(site.node) is cst.Call else []
    if not blocks:
        return True
    return any(_block_may_make_gradients(model, site, block) for block in blocks)


def _block_may_make_gradients(model: LoopModel, site: Site, block: cst.With) -> bool:
    parents = model.parents or {}
    current = parents.get(block)
    while current is not None and current is not site.function:
        if type(current) is cst.With and any(callee_name(i.item) in _NO_GRAD for i in current.items if type(i.item) is cst.Call):
            return False
        current = parents.get(current)
    nodes = list(walk(block.body))
    if any(type(n) is cst.Return or (type(n) is cst.Call and callee_name(n) in _BACKWARDS) for n in nodes):
        return True
    flowing = {dotted_name(t.target) for n in nodes if type(n) is cst.Assign for t in n.targets} - {None}
    if not flowing:
        return True  # nothing bound that can be followed
    holder = site.function if site.function is not None else model.module
    scope = model.file.once((_block_may_make_gradients, id(holder)), lambda: list(walk(holder)))
    for _ in range(3):  # ``pred`` -> ``loss = crit(pred, y)`` -> ``loss = loss / k``
        for node in scope:
            if type(node) is cst.Assign and mentions(node.value, flowing):
                flowing |= {dotted_name(t.target) for t in node.targets} - {None}
    for node in scope:
        if type(node) is cst.Call and callee_name(node) in _BACKWARDS and mentions(node, flowing):
            return True
        if type(node) is cst.Return and node.value is not None and mentions(node.value, flowing):
            return True
    return False


_BACKWARDS = frozenset({"backward", *frameworks.BACKWARD_METHODS})


class GradScalerWithGradientRelease(Rule):
    """A ``GradScaler`` (or a float16 autocast) is used together with gradient release.

    **Why it matters.** A ``GradScaler`` needs every gradient at once: it
    checks all of them for inf/NaN to decide whether to skip the step, and it
    unscales them all before the step. With gradient release each gradient
    has already been applied and freed during backward, so the scaler checks
    and unscales nothing, overflowing steps are applied, and the updates are
    multiplied by the loss scale. Float16 autocast without a scaler underflows
    small gradients instead.

    **Fix.** Use bfloat16 autocast, which needs no scaler, and drop the
    ``GradScaler``. Or keep float16 and turn gradient release off.

    **Stays quiet when**

    - the scaler or autocast is on the branch where release is off (the
      module's own release switch, learnt from where its set-up sits);
    - the module refuses the combination with a ``raise``; float16 autocast
      and its scaler in one function are reported once, at the autocast;
    - a float16 autocast makes nothing that is backpropagated: it is under
      ``torch.no_grad()`` (a frozen teacher), or what its block binds flows
      into no backward and no ``return`` (a validation pipeline, also entered
      through a name bound to the autocast:
      ``fixtures/release/ok_gl201_fp16_autocast_only_in_validation__LMFlow.py``).

    **Bad**::

        opt = AdamW(model.parameters(), lr=1e-3, gradient_release=True)
        prepare_for_gradient_release(model, opt)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()

    **Good**::

        opt = AdamW(model.parameters(), lr=1e-3, gradient_release=True)
        prepare_for_gradient_release(model, opt)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
    """

    code = "GL201"
    name = "gradscaler-with-gradient-release"
    summary = "a GradScaler or float16 autocast together with gradient release"
    severity = Severity.ERROR
    fix = None
    needs = ((RELEASE, SCALER), (RELEASE, "autocast"))

    def check(self, model: LoopModel) -> Iterator[Report]:
        release = model.release
        if not release.setups or "scaler" in release.refused:
            return
        reported = False
        scalers = list(_released_sites(model, release.scalers))
        autocasts = [(site, setup) for site, setup in _released_sites(model, release.fp16_autocasts) if _may_make_gradients(model, site)]
        # One problem, one finding: a float16 autocast and its scaler are reported once, at the autocast
        # (switching it to bfloat16 is the change; the scaler then goes too).
        paired = {id(s.node): s for s, _ in scalers if any(a.function is s.function for a, _ in autocasts)}
        for site, setup in scalers:
            if id(site.node) in paired:
                continue
            reported = True
            yield Report(
                site.node,
                f"`{model.code(site.node)}` is used together with {_describe(model, setup)}: the scaler needs every "
                f"gradient at once for its inf/NaN check and unscale, but release has already applied and freed "
                f"each one; use bfloat16 autocast, which needs no scaler",
            )
        for site, setup in autocasts:
            reported = True
            scaler = next((s for s in paired.values() if s.function is site.function), None)
            also = f", and drop the GradScaler at line {model.line(scaler.node)}" if scaler is not None else ""
            yield Report(
                site.node,
                f"float16 autocast `{model.code(site.node)}` is used together with {_describe(model, setup)}: "
                f"float16 needs a GradScaler, which needs every gradient at once, and release frees each one as "
                f"soon as it is applied; use `dtype=torch.bfloat16`, which needs no scaler{also}",
            )
        if reported:
            return
        for root, setups in released_roots(model):
            for event in root.events:
                if event.kind is EventKind.BACKWARD and event.scaled and not runs_without_release(_branches(event), model.release.flags):
                    yield Report(
                        event.node,
                        f"this backward is scaled by a GradScaler while {_describe(model, setups[0])} applies and "
                        f"frees each gradient during backward: the scaler's inf/NaN check and unscale see no "
                        f"gradients; use bfloat16 autocast, which needs no scaler",
                    )


class AccumulationWithGradientRelease(Rule):
    """Gradients are accumulated over several micro-batches together with gradient release.

    **Why it matters.** Accumulation sums the gradients of several backwards
    before one step. Gradient release steps each parameter during every
    backward and frees its gradient, so nothing is accumulated: each
    micro-batch is a full optimizer step with the learning rate meant for the
    whole batch, and the step under the accumulation guard does nothing.

    **Fix.** Drop the accumulation, or use optimi's optimizer accumulation,
    which accumulates into the optimizer states while releasing gradients
    (``opt.optimizer_accumulation = (i + 1) % accum != 0`` before backward).
    A recipe that raises when both are configured is fine.

    **Stays quiet when**

    - the accumulation runs only with release off, the module refuses it with
      a ``raise``, or optimi's ``optimizer_accumulation`` is used.

    **Bad**::

        prepare_for_gradient_release(model, opt)
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                opt.step()
                opt.zero_grad()

    **Good**::

        prepare_for_gradient_release(model, opt)
        for i, (x, y) in enumerate(loader):
            opt.optimizer_accumulation = (i + 1) % accum != 0
            loss_fn(model(x), y).backward()
    """

    code = "GL202"
    name = "accumulation-with-gradient-release"
    summary = "gradient accumulation together with gradient release"
    severity = Severity.ERROR
    fix = None
    needs = ((RELEASE, _ACCUM), *_ACCUMULATES)

    def check(self, model: LoopModel) -> Iterator[Report]:
        release = model.release
        if not release.setups or "accumulation" in release.refused or release.accumulating_optimizers:
            return
        reported = False
        for root, setups in released_roots(model):
            for node, how in _accumulations(model, root):
                reported = True
                yield Report(
                    node,
                    f"{how}, but {_describe(model, setups[0])} steps each parameter during every backward and "
                    f"frees its gradient: nothing accumulates and every micro-batch is a full step; drop the "
                    f"accumulation or {frameworks.RELEASE_ACCUMULATION_FIX}",
                )
        if reported:
            return
        for site, setup in _released_sites(model, release.accumulation_settings):
            yield Report(
                site.node,
                f"`{model.code(site.node)}` asks for gradient accumulation, but {_describe(model, setup)} steps each "
                f"parameter during every backward and frees its gradient: nothing accumulates; drop the "
                f"accumulation or {frameworks.RELEASE_ACCUMULATION_FIX}",
            )


_GUARDED_KINDS = (EventKind.STEP, EventKind.ZERO, EventKind.SCHED_STEP)


def _accumulations(model: LoopModel, root: Root) -> Iterator[tuple[cst.CSTNode, str]]:
    """Where a training loop of ``root`` accumulates: its optimizer guards and micro-batch loops."""
    seen: set[int] = set()
    for loop in root.loops():
        events = root.events_in(loop)
        backwards = [e for e in events if e.kind is EventKind.BACKWARD and not runs_without_release(_branches(e), model.release.flags)]
        if not backwards:
            continue
        for event in events:
            if event.kind not in _GUARDED_KINDS:
                continue
            inner = frames_inside(event, loop)
            for depth, frame in enumerate(inner):
                if frame.kind is not FrameKind.BRANCH or not frame.accumulation or id(frame.node) in seen:
                    continue
                if not any(not b.inside(frame) for b in backwards):
                    continue
                around = event.frames[: len(event.frames) - len(inner) + depth]
                if runs_without_release(_branches_of(around), model.release.flags):
                    continue
                seen.add(id(frame.node))
                yield frame.node, "the optimizer work under this accumulation guard waits for several micro-batches"
        for step in (e for e in events if e.kind is EventKind.STEP):
            if home_loop(root, step) is not loop or id(step.node) in seen:
                continue
            acc = accumulation(root, step, loop)
            if acc is not None and acc.style == "micro_loop" and not runs_without_release(_branches(step), model.release.flags):
                seen.add(id(step.node))
                yield step.node, f"`{step.target}` steps once after several backwards of the loop at line {model.line(acc.frame.node)}"


class ClippingWithGradientRelease(Rule):
    """Gradients are clipped together with gradient release.

    **Why it matters.** ``clip_grad_norm_`` needs every gradient at once to
    compute the total norm, and both clipping functions must run before the
    step. With gradient release each parameter has already been updated and
    its gradient freed during backward: the clip sees no gradients, and the
    updates were never clipped. Clipping one parameter's gradient inside the
    release hook is fine, and is not flagged.

    **Fix.** Drop the clipping, clip per parameter inside the hook, or use an
    optimizer with update clipping such as StableAdamW, which bounds each
    update without needing every gradient.

    The set-up may sit far from the loop: in another method of the class,
    in a hook that steps through a method it calls, in a class of the module
    whose ``__init__`` registers the hooks (as torchtune's
    ``OptimizerInBackward``), or in a function of another module of the
    package that the loop's module calls (the project index notes the
    functions and classes of the run that set release up); the same holds
    for GL201 and GL202.

    **Stays quiet when**

    - the clip runs inside the release hook (also one returned by a hook
      factory): it clips one parameter's gradient;
    - the clip runs only with release off (a flag named for release, or the
      switch the module tests before setting release up), clips another
      model, or the module refuses clipping with a ``raise``.

    **Bad**::

        prepare_for_gradient_release(model, opt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    **Good**::

        opt = StableAdamW(model.parameters(), lr=1e-3, gradient_release=True)
        prepare_for_gradient_release(model, opt)
        loss.backward()
    """

    code = "GL203"
    name = "clipping-with-gradient-release"
    summary = "gradient clipping together with gradient release"
    severity = Severity.ERROR
    fix = None
    needs = ((RELEASE, "clip"),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        release = model.release
        if not release.setups or "clipping" in release.refused:
            return
        for root, setups in released_roots(model):
            for clip in root.events:
                if clip.kind is not EventKind.CLIP or runs_without_release(_branches(clip), model.release.flags):
                    continue
                if _clips_another_model(clip, setups):
                    continue
                if _clipped_model(clip) is None and _steps_only_plain_optimizers(root, clip, setups):
                    continue
                yield Report(
                    clip.node,
                    f"`{model.code(clip.node)}` needs every gradient at once, but {_describe(model, setups[0])} has "
                    f"already applied and freed each one during backward: nothing is clipped; clip per parameter "
                    f"inside the hook, or {frameworks.RELEASE_CLIPPING_FIX}",
                )


def _names_its_optimizer(setup: ReleaseSetup) -> bool:
    style = frameworks.RELEASE_STYLES.get(setup.style)
    return style is not None and style.names_its_optimizer


def _clips_another_model(clip: Event, setups: list[ReleaseSetup]) -> bool:
    """Whether the clip names a model's parameters while release is known to cover only other models."""
    released = {last_name(s.model) for s in setups if s.model}
    owner = _clipped_model(clip)
    if owner is None or not released or any(s.model is None for s in setups):
        return False
    return last_name(owner) not in released


def _clipped_model(clip: Event) -> str | None:
    """``model`` for ``clip_grad_norm_(model.parameters(), ...)``."""
    node = clip.node
    if type(node) is not cst.Call or not node.args:
        return None
    for sub in walk(node.args[0].value):
        if type(sub) is cst.Call and callee_name(sub) in ("parameters", "named_parameters"):
            return dotted_name(receiver(sub))
    return None


def _steps_only_plain_optimizers(root: Root, clip: Event, setups: list[ReleaseSetup]) -> bool:
    """Whether the clip's loop steps only optimizers other than the released ones (set-ups that name the optimizer
    they release, where it is known)."""
    if any(not _names_its_optimizer(s) or s.optimizer is None for s in setups):
        return False
    released = {last_name(s.optimizer) for s in setups if s.optimizer}
    loop = clip.loops[-1] if clip.loops else None
    steps = [e for e in root.events_of(EventKind.STEP, loop) if e.target]
    return bool(steps) and all(last_name(s.target) not in released for s in steps)


class GradientReleaseCandidate(Rule):
    """A plain training loop whose optimizer could be fused into backward (gradient release).

    **What.** The loop runs one optimizer with a plain ``backward()``,
    ``step()``, ``zero_grad()``: no gradient accumulation, no clipping, no
    ``GradScaler``. Such a loop can step each parameter from a
    ``register_post_accumulate_grad_hook`` as soon as its gradient is ready
    and free the gradient at once, so that no more than a layer's worth of
    gradients is ever alive.

    **Why it matters.** It saves up to the memory of all gradients. How much
    that is worth depends on how large the gradients and the optimizer state
    are next to the activations: large for big models with small batches,
    little for small models with large activations. ``gradlint measure``
    runs the loop both ways and tells, with the step time of each. The
    memory can cost time: a release that steps each parameter with a call
    of its own pays that call for every parameter. On PyTorch's
    optimizer-in-backward tutorial loop (ViT-L, Adam, batch 1) on an H200,
    torch-optimi's release took 1.56 times the step as written and PyTorch's
    per-parameter hooks with ``fused=True`` 1.53 times; gradlint's
    ``GradientRelease``, which steps the parameters in buckets through the
    fused kernel, 1.19 times (0.85 on an H100), and 0.82 times on GPT-2.

    **Fix.** Keep the optimizer and add ``GradientRelease(optimizer)`` after
    it (``from gradlint.runtime.release import GradientRelease``). Its
    ``step()`` and ``zero_grad()`` then end the iteration and do nothing
    else; its class, hyper-parameters, ``state_dict`` and schedulers stay as
    they were, and the steps are bitwise those of ``fused=True``. It refuses
    at run time, with an error, a scaler, a clip or a second backward before
    ``step()``. The script then needs gradlint where it trains. A module
    that already uses torch-optimi is rewritten to optimi's
    ``gradient_release=True`` with ``prepare_for_gradient_release(model,
    opt)`` instead. If the step time matters more than the memory, measure
    first.

    The bad example is not wrong, only larger than it needs to be.

    **Stays quiet when**

    - the loop accumulates, clips, scales, hands the optimizer away, divides
      gradients or steps more than one optimizer; the module uses a scaler,
      DDP, accelerate, CUDA graphs or its own ``.grad`` code, or already
      releases.

    **Bad**::

        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()

    **Good**::

        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        GradientRelease(opt)
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    """

    code = "GL204"
    name = "gradient-release-candidate"
    summary = "a plain loop whose single optimizer could be fused into backward (gradient release)"
    severity = Severity.INFO
    fix = FixKind.UNSAFE
    enabled_by_default = False
    needs = ((BACKWARD, STEP),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        if model.release.setups or not _plain_module(model):
            return
        stepped = {last_name(e.target) for root in model.roots for e in root.events if e.kind is EventKind.STEP and e.target}
        if len(stepped) != 1:
            return
        for root in model.roots:
            for step, loop in steps_with_loops(root):
                if _plain_loop(model, root, step, loop):
                    zeros = [e for e in root.events_in(loop) if e.kind is EventKind.ZERO and clears(model, e, step.target)]
                    fix = release_fix(model, step, zeros)
                    rewrite = f" (fix: {fix.description})" if fix is not None else ""
                    yield Report(
                        step.node,
                        f"`{step.target}` is the only optimizer of this plain loop (no accumulation, clipping or "
                        f"GradScaler): fused into backward (gradient release) it would free each gradient as soon as "
                        f"it is applied; the saving depends on how large gradients and optimizer state are next to "
                        f"the activations, and `gradlint measure` tells, with what it costs in step time (on ViT-L on a "
                        f"GPU: 1.2x the step in buckets through the fused kernel, 1.5x stepping each parameter "
                        f"alone){rewrite}",
                        fix=fix,
                    )


def _plain_module(model: LoopModel) -> bool:
    """No scaler, no data-parallel model or framework object, no CUDA graphs, no code of its own on ``.grad``: nothing
    release would break."""
    if model.uses_cuda_graphs or model.release.touches_grads:
        return False
    return not any(info.kind in (ObjKind.SCALER, ObjKind.PARALLEL_MODEL, ObjKind.PREPARER) for info in model.objects.values())


def _plain_loop(model: LoopModel, root: Root, step: Event, loop: Frame) -> bool:
    """One backward, one direct step and a clear of that optimizer, nothing else in the way."""
    if step.via_scaler is not None or step.framework is not None or step.target not in model.objects:
        return False
    if any(f.kind is FrameKind.BRANCH for f in frames_inside(step, loop)):
        return False
    backwards = root.events_of(EventKind.BACKWARD, loop)
    if len(backwards) != 1 or backwards[0].framework is not None or backwards[0].scaled:
        return False
    if len(root.events_of(EventKind.STEP, loop)) != 1:
        return False
    if accumulation(root, step, loop) is not None:
        return False
    events = root.events_in(loop)
    if any(e.kind in (EventKind.CLIP, EventKind.UNSCALE, EventKind.SCALER_UPDATE) for e in events):
        return False
    if any(e.kind in (HANDOFF, GRAD_DIVIDE) for e in events) or any(f.accumulation for e in events for f in e.frames):
        return False
    return any(clears(model, e, step.target) for e in root.events_of(EventKind.ZERO, loop))
