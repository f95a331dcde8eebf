"""A rule about the gradients an optimizer applies: those another network's loss left on its parameters (GL017).

Which networks an optimizer was built over, which a loss reaches, and whether
``requires_grad`` is switched off for them are read by ``gradlint.reach``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.model import HANDOFF, LoopModel
from gradlint.module_index import Unpacked
from gradlint.objects import ObjKind, last_name
from gradlint.queries import (
    clears, exclusive, function_holding, handoff_may_clear, handoff_may_step, opposite_sides_of_settings, same_object,
)
from gradlint.reach import loss_reaching_call, parameter_owners, reaching_call, requires_grad_switched_off
from gradlint.rule import BACKWARD, STEP, Report, Rule, call_of
from gradlint.syntax import dotted_name


class StepTakesAnotherLossGradients(Rule):
    """An optimizer cleared only after its step also applies the gradients another network's loss left on its parameters.

    **Why it matters.** A backward fills the gradients of every parameter the
    loss depends on, not only those of the optimizer stepped next. A
    generator's loss runs through the discriminator (``D(G(z))``), so its
    backward leaves gradients on the discriminator's parameters too; an
    actor's loss runs through the critic. When the discriminator's optimizer
    is cleared only after its own step (``d_loss.backward(); opt_d.step();
    opt_d.zero_grad()``), or before the generator's backward, those leftovers
    are still there at its next step, which applies the sum: the
    discriminator also moves to help the generator fool it. Training goes on;
    the adversarial game is quietly broken. The same happens when the other
    loss is backpropagated after the optimizer's own and before its step
    (``q_opt.zero_grad(); q_loss.backward(); pi_opt.zero_grad();
    pi_loss.backward(); q_opt.step()``): a backward counts as another
    optimizer's when that optimizer, stepped after it, is cleared between the
    earlier backward and it. Optimizers and networks kept in lists
    (``q_opts.append(Adam(q_nets[i].parameters()))``) are read element by
    element: a loss calling any ``q_nets[j]`` reaches them. When a setting
    picks which of an optimizer's steps runs (``if amp: scaler.step(opt_d)
    else: opt_d.step()``), each step is reported with the backward of its
    own side.

    A function with no loop that no loop of the run calls (an agent's
    ``update_actr_crit(self, batch)``, called once per batch from elsewhere) is
    read from its first line to each step: the actor's backward before the
    critic's own, with the critic cleared only after its step, leaks within one
    call (``fixtures/realworld/gl017_actor_loss_through_critic_in_loopless_update__sam-dac-pytorch.py``;
    cleared before its own backward:
    ``fixtures/realworld/ok_gl017_each_optimizer_cleared_before_its_backward_in_loopless_update__sam-dac-pytorch.py``).
    What happens between two calls is not seen there.

    One backward of a sum of losses counts the same way: when every term of
    ``loss = lossDreal + lossDfake + lossG`` (or ``(actor_loss +
    critic_loss).backward()``) is named for exactly one of the optimizers
    stepped after it (``lossG`` and ``optimizerG``, ``d_loss_real`` and
    ``opt_d``, ``actor_loss`` and ``actor_optimizer``), each optimizer's step
    applies the gradients of the terms named for the others; a term that
    reaches its network is reported. A number alone names nothing: ``loss1 +
    loss2`` beside ``optimizer1`` and ``optimizer2`` is one objective
    (``fixtures/realworld/ok_gl017_numbered_loss_terms_summed__DeepLense.py``).
    Losses backpropagated one after the other with no step or clear between
    (``scaler.scale(site_loss).backward(retain_graph=True);
    scaler.scale(outcome_loss).backward()`` before both steps) pile up into
    the same gradients and are read as one sum
    (``fixtures/realworld/gl017_two_losses_backpropagated_before_both_steps__slideflow.py``).

    **Fix.** Clear the optimizer right before its own backward (or step it
    before the other loss's backward), or switch the other network's
    ``requires_grad`` off while the other loss is backpropagated (Lightning:
    ``toggle_optimizer``).

    **Stays quiet when**

    - the optimizer is cleared between the other loss's backward and its own
      step (``fixtures/gan/dcgan_correct.py``, ``fixtures/parameters/ok_clear_before_own_backward.py``);
    - the other loss's computation does not visibly call the optimizer's
      network, or a network holding it (``self.vae(img)`` for an optimizer
      over ``vae.discr``), outside ``.detach()`` and ``torch.no_grad()``;
      the network's call is followed back through the assignments of the
      function (every branch of the ``if`` that last binds a name, and a
      local name bound only to the network, ``G, D = self.generator,
      self.discriminator``) and into the returns of the module's own helpers
      only;
    - the module may switch ``requires_grad`` off for that network (any
      switch that does not visibly name another network:
      ``fixtures/parameters/ok_discriminator_requires_grad_off.py``; Lightning's
      ``toggle_optimizer``: ``fixtures/parameters/ok_lightning_toggle_optimizer.py``,
      unless it is handed the optimizer over that very network, which it
      leaves on:
      ``fixtures/realworld/gl017_lightning_generator_loss_through_aliased_discriminator__cordvox.py``);
    - the optimizer's own loss runs through the other loss's network too
      (both losses mixed both ways, as BicycleGAN's generator-and-encoder
      loss is meant: ``fixtures/realworld/gl017_generator_and_encoder_loss_shared__PyTorch-GAN.py``);
      a network holding the optimizer's own (``vae`` for ``vae.discr``) is
      no such evidence, its forward decides what the other loss reaches; nor
      is a critic: when the other loss reaches this network only as the input
      of the other's own network (``gan_loss`` of ``self.discriminator(decoded_images)``),
      this network's loss running through the critic is how it learns
      (``fixtures/realworld/gl017_discriminator_loss_through_undetached_reconstruction__poretransformer.py``;
      the discriminator trained on ``decoded_images.detach()``:
      ``fixtures/realworld/ok_gl017_discriminator_trained_on_detached_reconstruction__poretransformer.py``;
      unless the other loss is what the call of the other's network returns,
      ``d_loss, logs = loss_module(images, recon, mode="discriminator")``,
      whose forward may detach what it is handed:
      ``fixtures/realworld/ok_gl017_loss_module_computes_discriminator_loss__1d-tokenizer.py``);
    - the other loss is stepped by this optimizer too (one loss for two
      optimizers), or the optimizer has no backward of its own before its step;
      a backward between the optimizer's own and its step is another's only
      when a clear of that other optimizer, not of this one, runs between the
      earlier backward and it (``fixtures/parameters/ok_gl017_critic_list_stepped_before_actor_loss.py``,
      ``fixtures/realworld/ok_gl017_q_requires_grad_off_for_policy_loss__REDQ.py``);
    - the other loss's backward sits on the other side of a setting from the
      step (``if amp:`` / ``else:``): they never run in one pass
      (``fixtures/realworld/ok_gl017_disc_cleared_after_generator_step__encodec-pytorch.py``);
    - for one backward of a sum of losses: a term is not a plain name (times a
      number), a term's name is not that of exactly one optimizer stepped after
      it, or no term is named for this optimizer (the pairing is not shown:
      ``loss = recon_loss + 0.1 * kl_loss``); the other optimizer is built over
      this optimizer's network too (one network trained by both); the other
      term does not reach this optimizer's network (detached, as above:
      ``fixtures/parameters/ok_gl017_summed_losses_meant_for_both.py``,
      ``fixtures/realworld/ok_gl017_generator_then_discriminator_losses__Realistic-Neural-Talking-Head-Models.py``),
      or ``requires_grad`` is switched off for it
      (``fixtures/parameters/ok_gl017_summed_losses_critic_frozen.py``); the
      losses mixed both ways are no excuse here, the names say which is whose;
    - a list of optimizers is picked by a constant (``opts[0]``) with no
      assignment of that element: which network it holds is not read;
    - the optimizer is never cleared (GL001), steps twice with no clear between
      (GL001), or is handed to code the module cannot see.

    **Bad**::

        for real in loader:
            fake = netG(torch.randn(real.size(0), nz))
            g_loss = bce(netD(fake), ones)
            g_loss.backward()                 # also fills netD's gradients
            opt_g.step()
            opt_g.zero_grad()
            d_loss = bce(netD(real), ones) + bce(netD(fake.detach()), zeros)
            d_loss.backward()
            opt_d.step()                      # applies g_loss's gradients too
            opt_d.zero_grad()

    **Good**::

        for real in loader:
            fake = netG(torch.randn(real.size(0), nz))
            g_loss = bce(netD(fake), ones)
            g_loss.backward()
            opt_g.step()
            opt_g.zero_grad()
            opt_d.zero_grad()                 # drop what g_loss left on netD
            d_loss = bce(netD(real), ones) + bce(netD(fake.detach()), zeros)
            d_loss.backward()
            opt_d.step()
    """

    code = "GL017"
    name = "step-takes-another-loss-gradients"
    summary = "an optimizer's step also applies the gradients another network's loss left on its parameters"
    severity = Severity.ERROR
    fix = None  # where the clear belongs, or whether to switch requires_grad off, is the author's call
    needs = ((BACKWARD, STEP, call_of("zero_grad")),)

    def check(self, model: LoopModel) -> Iterator[Report]:
        if model.index is None:
            return
        reported: dict[tuple[int, str], list] = {}  # the steps reported, per loop and optimizer
        switched_off: dict[frozenset[str], bool] = {}
        for root in model.roots:
            for loop, events, wraps in _cycles(model, root):
                steps = [e for e in events if _plain_optimizer_step(model, e)]
                if len({last_name(s.target) for s in steps}) < 2:
                    continue
                for step in steps:
                    key = (id(loop), last_name(step.target))
                    if any(not opposite_sides_of_settings(model, step, earlier) for earlier in reported.get(key, [])):
                        continue  # one finding per optimizer, unless a setting picks which of its steps runs
                    since = _since_clear(model, events, step, wraps)
                    if since is None:
                        continue
                    found = _leak_into(model, events, step, *since)
                    summed = None if found is not None else _summed_leak(model, events, step, since[1])
                    if found is None and summed is None:
                        continue
                    reach = found[4] if found is not None else summed[3]
                    owners = frozenset({reach.owner})
                    if owners not in switched_off:
                        switched_off[owners] = requires_grad_switched_off(model, owners)
                    if switched_off[owners]:
                        continue
                    reported.setdefault(key, []).append(step)
                    if found is not None:
                        clear, foreign, stepper, own, reach, after_own = found
                        message = _leak_message(model, events, clear, foreign, stepper, own, step, reach, after_own)
                        yield Report(step.node, message, event=step, against=(clear, foreign))
                    else:
                        backward, term, stepper, reach, piled = summed
                        message = _summed_message(model, backward, term, stepper, step, reach, piled)
                        yield Report(step.node, message, event=step, against=(backward,))


_BOOKKEEPING = frozenset({EventKind.BACKWARD, EventKind.STEP, EventKind.ZERO, HANDOFF})


def _cycles(model: LoopModel, root) -> Iterator[tuple[cst.CSTNode, list, bool]]:
    """What is read as one pass of bookkeeping: ``(key, events, wraps)``.

    One iteration of each loop of a root that no other loop of it holds, read as a cycle (``wraps``: what ran
    before the step may be the end of the previous iteration). And a function with no loop that no loop of the
    run calls (``def update(self, batch)`` of an agent, run by a loop elsewhere): one call read from its first
    line to the step only, since what happens between calls is not seen.
    """
    loops = root.loops()
    for loop in loops:
        if root.events_in(loop)[0].loops[0] is loop:
            yield loop, [e for e in root.events_in(loop) if e.kind in _BOOKKEEPING], True
    function = root.node
    if loops or type(function) is not cst.FunctionDef or function.name.value in model.called_in_loop:
        return
    if any(e.loops for e in root.events):
        return  # a loop inside an inlined helper, or read as an iteration of the callers' loop
    yield function, [e for e in root.events if e.kind in _BOOKKEEPING], False


def _plain_optimizer_step(model: LoopModel, event) -> bool:
    if event.kind is not EventKind.STEP or event.target is None or event.framework == "closure":
        return False
    return event.target_kind is ObjKind.OPTIMIZER or model.info(event.target).kind is ObjKind.OPTIMIZER


def _since_clear(model: LoopModel, events: list, step, wraps: bool = True) -> tuple | None:
    """``(clear, backwards)``: the last clear of ``step``'s optimizer, read back from the step around the iteration,
    and the backwards between it and the step whose gradients the step applies, latest first; None when the
    optimizer is never cleared, steps again with no clear between (GL001) or is handed to code that may clear.

    Without ``wraps`` (one call of a function with no loop) the reading stops at the function's first line: the
    clear is then the optimizer's clear after the step, which shows the function does its own bookkeeping."""
    optimizer = step.target
    position = next(i for i, e in enumerate(events) if e is step)
    window: list = []  # backwards since the last clear, latest first
    clear = None
    wrapped = False
    for back in range(1, len(events)):
        index = position - back
        if index < 0:
            if not wraps:
                break
            index += len(events)
            wrapped = True
        event = events[index]
        if event.kind is EventKind.ZERO and clears(model, event, optimizer) and not event.recovers:
            clear = event
            break
        if event.kind is HANDOFF and not (handoff_may_clear(event, model.keeps_handed) or handoff_may_step(event.node)):
            continue  # ``self.toggle_optimizer(opt_d)``: handed to code that neither steps nor clears it
        if event.kind in (EventKind.STEP, HANDOFF) and (event.target is None or same_object(event.target, optimizer)) and not (
            exclusive(event, step) or opposite_sides_of_settings(model, event, step)
        ):
            return None  # stepped again with no clear between (GL001), or handed to code that may clear
        if event.kind is EventKind.BACKWARD and (wrapped or not exclusive(event, step)) and not opposite_sides_of_settings(model, event, step):
            window.append(event)
    if clear is None and not wraps:
        clear = next((e for e in events[position + 1:] if e.kind is EventKind.ZERO and clears(model, e, optimizer)), None)
    return (clear, window) if clear is not None else None


def _leak_into(model: LoopModel, events: list, step, clear, window: list):
    """``(clear, foreign backward, the optimizer it is stepped for, own backward, reach, after own)`` when a backward
    stepped by another optimizer, among the ``window`` of backwards since the ``clear`` of ``step``'s optimizer,
    reaches that optimizer's network; ``after own`` when that backward runs between the optimizer's own latest
    backward and its step (then clearing earlier cannot help)."""
    optimizer = step.target
    if len(window) < 2:
        return None
    owners = parameter_owners(model, optimizer)
    if not owners:
        return None
    own: list = []
    later: list = []  # other optimizers' backwards after the optimizer's own, each marked by its optimizer's clear
    for backward in window:  # latest first: the optimizer's own backwards come before the other losses'
        stepped, marked = _stepped_after(model, events, backward)
        if not stepped:
            continue
        if any(same_object(s, optimizer) for s in stepped):
            own.append(backward)
            continue
        if not own:
            if not marked:
                return None  # a foreign backward nearest the step: no backward of its own to clear before
            later.append((backward, stepped))
            continue
        found = _reaching(model, backward, stepped, owners, own)
        if found is not None:
            return clear, backward, stepped[0], own[-1], found, False
    if own:
        for backward, stepped in later:  # its own loss backpropagated, then another's, then its step
            found = _reaching(model, backward, stepped, owners, own)
            if found is not None:
                return clear, backward, stepped[0], own[0], found, True
    return None


def _reaching(model: LoopModel, backward, stepped: list[str], owners: frozenset[str], own: list):
    """How another optimizer's backward reaches ``owners``, unless the optimizer's own losses run through that
    optimizer's networks too (the losses mixed both ways, maybe on purpose)."""
    others = frozenset().union(*(parameter_owners(model, s) for s in stepped))
    reach = reaching_call(model, backward, owners, others)
    if reach is None:
        return None
    if others and any(reaching_call(model, mine, others, owners) is not None for mine in own):
        if backward.loss is None or loss_reaching_call(model, backward.loss, owners, others, judged_by=others) is not None:
            return None
        if _returned_by_a_call_of(model, backward.loss, others):
            return None  # ``d_loss, logs = loss_module(images, recon, mode="discriminator")``: its forward may detach
        # the other loss reaches this network only as the input of its own network (``d_loss`` of
        # ``self.discriminator(decoded_images)``): a critic judging this network's output, whose loss leaks back
        # through the undetached input; this network's loss running through the critic is how it learns from it
    return reach


def _returned_by_a_call_of(model: LoopModel, loss: cst.BaseExpression, networks: frozenset[str]) -> bool:
    """Whether the loss is bound straight to what a call of one of ``networks`` returns (``discriminator_loss, logs =
    loss_module(images, reconstructed_images, mode="discriminator")``): that network computes the loss, and whether
    its forward detaches what it is handed only its code says."""
    name = dotted_name(loss) if type(loss) in (cst.Name, cst.Attribute) else None
    function = function_holding(model, loss)
    values = model.index.assignments.get(function, {}).get(name, []) if name is not None else []
    for value in values:
        call = value.value if type(value) is Unpacked else value
        if type(call) is cst.Call and any(
            (called := dotted_name(call.func)) is not None and last_name(called) == last_name(network)
            for network in networks
        ):
            return True
    return False


def _stepped_after(model: LoopModel, events: list, backward) -> tuple[list[str], bool]:
    """The optimizers whose steps take this backward's gradients: those stepped after it, up to the next backward that
    follows a step (backwards piling up for one step share its optimizers); and whether a clear marks it as the loss
    of some of them only.

    When clears of some of those optimizers run after the backward before it
    (``opt_q.zero_grad(); q_loss.backward(); opt_pi.zero_grad();
    pi_loss.backward(); opt_q.step(); opt_pi.step()``), the backward starts
    their accumulation, not that of the optimizers cleared before the earlier
    backward: it is theirs alone."""
    stepped: list[str] = []
    start = next(i for i, e in enumerate(events) if e is backward)
    for event in events[start + 1:]:
        if event.kind is EventKind.BACKWARD and stepped and not exclusive(event, backward):
            break
        if event.kind is EventKind.STEP and event.target is not None and not exclusive(event, backward):
            stepped.append(event.target)
    cleared: list = []
    for event in reversed(events[:start]):
        if event.kind is EventKind.BACKWARD and not exclusive(event, backward):
            break
        if event.kind is EventKind.ZERO and event.target is not None and not exclusive(event, backward):
            cleared.append(event)
    if not cleared or not any(e.kind is EventKind.BACKWARD and not exclusive(e, backward) for e in events[:start]):
        return stepped, False  # no earlier backward of the iteration whose optimizers it could be told apart from
    marked = [s for s in stepped if any(clears(model, zero, s) for zero in cleared)]
    if not marked or len(marked) == len(stepped):
        return stepped, False
    return marked, True


def _summed_leak(model: LoopModel, events: list, step, window: list):
    """``(backward, term, the optimizer it is named for, reach, piled)`` when the losses backpropagated since ``step``'s
    optimizer's clear, with no step between them, add up to one sum whose every term is named for exactly one of the
    optimizers stepped after them, some for this one, and a term named for another optimizer reaches this optimizer's
    network, which that optimizer is not built over too. The sum is one loss (``loss = lossDreal + lossDfake + lossG``
    before ``optimizerG.step(); optimizerD.step()``) or several backpropagated one after the other (``piled``:
    ``site_loss.backward(); outcome_loss.backward()`` before both steps)."""
    if not window:
        return None
    optimizer = step.target
    stepped, _ = _stepped_after(model, events, window[0])
    distinct = {last_name(s): s for s in stepped}
    if len(distinct) < 2 or last_name(optimizer) not in distinct:
        return None
    piled = _piled(model, events, window, set(distinct))
    terms: list[tuple[str, cst.BaseExpression, object]] = []  # (term's name, term, its backward)
    for backward in piled:
        summed = _summed_terms(model, backward)
        if summed is None and len(piled) > 1 and backward.loss is not None and type(backward.loss) in (cst.Name, cst.Attribute):
            summed = [(dotted_name(backward.loss), backward.loss)]
        if summed is None:
            return None
        terms.extend((name, term, backward) for name, term in summed)
    paired: list[tuple[str, cst.BaseExpression, object, str]] = []  # (term's name, term, backward, its optimizer)
    for name, term, backward in terms:
        named_for = [s for s in distinct.values() if _named_for(name, s)]
        if len(named_for) != 1:
            return None  # the pairing of this term to an optimizer is not shown
        paired.append((name, term, backward, named_for[0]))
    if len({last_name(s) for *_, s in paired}) < 2 or not any(same_object(s, optimizer) for *_, s in paired):
        return None
    owners = parameter_owners(model, optimizer)
    if not owners:
        return None
    for name, term, backward, stepper in paired:
        if same_object(stepper, optimizer):
            continue
        others = parameter_owners(model, stepper)
        if not others or others & owners:
            continue  # one network under both optimizers: its own optimizer trains it with this loss too
        reach = loss_reaching_call(model, term, owners, others)
        if reach is not None:
            return backward, name, stepper, reach, len(piled) > 1
    return None


def _piled(model: LoopModel, events: list, window: list, stepped: set[str]) -> list:
    """The backwards at the head of ``window`` (latest first) that pile up for the same steps: each taken by exactly
    the optimizers in ``stepped``, none marked by a clear as the loss of some of them only."""
    piled = []
    for backward in window:
        after, marked = _stepped_after(model, events, backward)
        if marked or {last_name(s) for s in after} != stepped:
            break
        piled.append(backward)
    return piled


def _summed_terms(model: LoopModel, backward) -> list[tuple[str, cst.BaseExpression]] | None:
    """The named terms of the sum a backward's loss is (``(actor_loss + critic_loss).backward()``, or ``loss`` last
    assigned ``lossD + 0.5 * lossG`` above the backward and not added to since); None when it is no such sum or a term
    is not a plain name (times a number)."""
    loss = backward.loss
    if loss is None:
        return None
    if type(loss) in (cst.Name, cst.Attribute):
        name = dotted_name(loss)
        function = function_holding(model, backward.node)
        line = model.line(backward.node)
        values = [
            v for v in model.index.assignments.get(function, {}).get(name, [])
            if model.line(v.value if type(v) is Unpacked else v) < line
        ]
        if not values:
            return None
        loss = max(values, key=lambda v: model.line(v.value if type(v) is Unpacked else v))
        if type(loss) is Unpacked or any(
            dotted_name(a.target) == name and model.line(loss) < model.line(a) < line
            for a in model.index.augmented.get(function, [])
        ):
            return None
    if type(loss) is not cst.BinaryOperation or type(loss.operator) is not cst.Add:
        return None
    terms: list[tuple[str, cst.BaseExpression]] = []
    pending: list[cst.BaseExpression] = [loss]
    while pending:
        node = pending.pop()
        if type(node) is cst.BinaryOperation and type(node.operator) is cst.Add:
            pending.extend((node.right, node.left))
            continue
        term = node
        if type(node) is cst.BinaryOperation and type(node.operator) is cst.Multiply:
            factors = [f for f in (node.left, node.right) if type(f) not in (cst.Integer, cst.Float)]
            term = factors[0] if len(factors) == 1 else None
        name = dotted_name(term) if term is not None and type(term) in (cst.Name, cst.Attribute) else None
        if name is None:
            return None
        terms.append((name, term))
    return terms


_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_LOSS_WORDS = frozenset({"loss", "losses", "err", "error"})
_OPTIMIZER_WORDS = frozenset({"opt", "optim", "optimizer", "optimiser", "optimizers", "optimisers", "self"})


def _named_for(term: str, optimizer: str) -> bool:
    """Whether a loss's name says which optimizer it is for: the words left of each name without ``loss`` / ``opt``
    words begin alike (``d_loss_real`` and ``opt_d``, ``actor_loss`` and ``actor_optimizer``), or the optimizer's is one
    capital letter that begins the loss's first word (``lossDfake`` and ``optimizerD``). A number alone (``loss2`` and
    ``optimizer2``) says nothing: the terms of one loss are often numbered as the optimizers are."""
    mine = [w for w in _WORDS.findall(last_name(optimizer)) if w.lower() not in _OPTIMIZER_WORDS]
    theirs = [w for w in _WORDS.findall(last_name(term)) if w.lower() not in _LOSS_WORDS]
    if not mine or not theirs or all(w.isdigit() for w in mine):
        return False  # ``loss2`` and ``optimizer2``: a number orders the terms and the optimizers, it names no network
    if [w.lower() for w in theirs[: len(mine)]] == [w.lower() for w in mine]:
        return True
    letter = mine[0]
    return len(mine) == 1 and len(letter) == 1 and letter.isupper() and theirs[0][:1] == letter and theirs[0][1:2].islower()


def _network_reached(model: LoopModel, reach) -> tuple[str, str]:
    """The network a loss reaches, in words, and how it reaches it: every element of a list of networks (one
    optimizer each), a network a called module holds, or the network called itself."""
    if reach.owner.endswith("[*]"):
        return f"the networks of `{reach.owner[:-3]}`", f"it calls `{model.code(reach.call.func)}` at line {model.line(reach.call)}"
    network = f"`{reach.owner}`"
    how = (
        f"it calls `{model.code(reach.call.func)}`, which holds {network}" if reach.through is not None
        else f"it calls {network} at line {model.line(reach.call)}"
    )
    return network, how


def _summed_message(model: LoopModel, backward, term: str, stepper: str, step, reach, piled: bool) -> str:
    optimizer = step.target
    network, how = _network_reached(model, reach)
    summed = (
        f"its backward at line {model.line(backward.node)} runs beside `{optimizer}`'s own with no step or clear between"
        if piled else f"the two losses are summed into the one backward at line {model.line(backward.node)}"
    )
    return (
        f"this step of `{optimizer}` also applies the gradients of `{term}`, the loss of `{stepper}`, on {network} "
        f"({how}): {summed}; backpropagate each optimizer's loss on its own and clear between them, detach what "
        f"`{term}` reads of {network}, or switch {network}'s `requires_grad` off for it"
    )


def _leak_message(model: LoopModel, events: list, clear, foreign, stepper: str, own, step, reach, after_own: bool) -> str:
    optimizer = step.target
    network, how = _network_reached(model, reach)
    switch = (
        f"switch `requires_grad` off for {network} during the other loss" if reach.owner.endswith("[*]")
        else f"switch {network}'s `requires_grad` off for the other loss"
    )
    taken = (
        f"this step of `{optimizer}` also applies the gradients that the loss backpropagated at line "
        f"{model.line(foreign.node)} for `{stepper}` left on {network} ({how})"
    )
    if after_own:
        return (
            f"{taken}: that backward runs after `{optimizer}`'s own at line {model.line(own.node)} and before this "
            f"step; step `{optimizer}` before it, or {switch}"
        )
    after_step = events.index(clear) > events.index(step)
    cleared = (
        f"only after its step, at line {model.line(clear.node)}" if after_step
        else f"at line {model.line(clear.node)}, before that backward"
    )
    return (
        f"{taken}: `{optimizer}` is cleared {cleared}; clear it just before its own backward at line "
        f"{model.line(own.node)}, or {switch}"
    )
