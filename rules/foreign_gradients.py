"""A rule about the gradients an optimizer applies: those another network's loss left on its parameters (GL017).

Which networks an optimizer was built over, which a loss reaches, and whether
``requires_grad`` is switched off for them are read by ``gradlint.reach``.
"""

from __future__ import annotations

from collections.abc import Iterator

from gradlint.events import EventKind
from gradlint.findings import Severity
from gradlint.model import HANDOFF, LoopModel
from gradlint.objects import ObjKind, last_name
from gradlint.queries import clears, exclusive, opposite_sides_of_settings, same_object
from gradlint.reach import parameter_owners, reaching_call, requires_grad_switched_off
from gradlint.rule import BACKWARD, STEP, Report, Rule, call_of


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
      function and into the returns of the module's own helpers only;
    - the module may switch ``requires_grad`` off for that network (any
      switch that does not visibly name another network:
      ``fixtures/parameters/ok_discriminator_requires_grad_off.py``; Lightning's
      ``toggle_optimizer``: ``fixtures/parameters/ok_lightning_toggle_optimizer.py``);
    - the optimizer's own loss runs through the other loss's network too
      (both losses mixed both ways, as BicycleGAN's generator-and-encoder
      loss is meant: ``fixtures/realworld/gl017_generator_and_encoder_loss_shared__PyTorch-GAN.py``);
      a network holding the optimizer's own (``vae`` for ``vae.discr``) is
      no such evidence, its forward decides what the other loss reaches;
    - the other loss is stepped by this optimizer too (one loss for two
      optimizers), or the optimizer has no backward of its own before its step;
      a backward between the optimizer's own and its step is another's only
      when a clear of that other optimizer, not of this one, runs between the
      earlier backward and it (``fixtures/parameters/ok_gl017_critic_list_stepped_before_actor_loss.py``,
      ``fixtures/realworld/ok_gl017_q_requires_grad_off_for_policy_loss__REDQ.py``);
    - the other loss's backward sits on the other side of a setting from the
      step (``if amp:`` / ``else:``): they never run in one pass
      (``fixtures/realworld/ok_gl017_disc_cleared_after_generator_step__encodec-pytorch.py``);
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
            for loop in _outer_loops(root):
                events = [e for e in root.events_in(loop) if e.kind in _BOOKKEEPING]
                steps = [e for e in events if _plain_optimizer_step(model, e)]
                if len({last_name(s.target) for s in steps}) < 2:
                    continue
                for step in steps:
                    key = (id(loop), last_name(step.target))
                    if any(not opposite_sides_of_settings(model, step, earlier) for earlier in reported.get(key, [])):
                        continue  # one finding per optimizer, unless a setting picks which of its steps runs
                    found = _leak_into(model, events, step)
                    if found is None:
                        continue
                    clear, foreign, stepper, own, reach, after_own = found
                    owners = frozenset({reach.owner})
                    if owners not in switched_off:
                        switched_off[owners] = requires_grad_switched_off(model, owners)
                    if switched_off[owners]:
                        continue
                    reported.setdefault(key, []).append(step)
                    yield Report(
                        step.node, _leak_message(model, events, clear, foreign, stepper, own, step, reach, after_own),
                        event=step, against=(clear, foreign),
                    )


_BOOKKEEPING = frozenset({EventKind.BACKWARD, EventKind.STEP, EventKind.ZERO, HANDOFF})


def _outer_loops(root) -> list:
    """The loops of a root that no other loop of it holds: one iteration of each is read as a cycle."""
    return [loop for loop in root.loops() if root.events_in(loop)[0].loops[0] is loop]


def _plain_optimizer_step(model: LoopModel, event) -> bool:
    if event.kind is not EventKind.STEP or event.target is None or event.framework == "closure":
        return False
    return event.target_kind is ObjKind.OPTIMIZER or model.info(event.target).kind is ObjKind.OPTIMIZER


def _leak_into(model: LoopModel, events: list, step):
    """``(clear, foreign backward, the optimizer it is stepped for, own backward, reach, after own)`` when a backward
    stepped by another optimizer, since the last clear of ``step``'s optimizer (read back from the step, around the
    iteration), reaches that optimizer's network; ``after own`` when that backward runs between the optimizer's own
    latest backward and its step (then clearing earlier cannot help)."""
    optimizer = step.target
    position = next(i for i, e in enumerate(events) if e is step)
    window: list = []  # backwards since the last clear, latest first
    clear = None
    wrapped = False
    for back in range(1, len(events)):
        index = position - back
        if index < 0:
            index += len(events)
            wrapped = True
        event = events[index]
        if event.kind is EventKind.ZERO and clears(model, event, optimizer) and not any(f.branch == "except" for f in event.frames):
            clear = event
            break
        if event.kind in (EventKind.STEP, HANDOFF) and (event.target is None or same_object(event.target, optimizer)) and not (
            exclusive(event, step) or opposite_sides_of_settings(model, event, step)
        ):
            return None  # stepped again with no clear between (GL001), or handed to code that may clear
        if event.kind is EventKind.BACKWARD and (wrapped or not exclusive(event, step)) and not opposite_sides_of_settings(model, event, step):
            window.append(event)
    if clear is None or len(window) < 2:
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
        return None
    return reach


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


def _leak_message(model: LoopModel, events: list, clear, foreign, stepper: str, own, step, reach, after_own: bool) -> str:
    optimizer = step.target
    if reach.owner.endswith("[*]"):  # every element of a list of networks, one optimizer each
        network = f"the networks of `{reach.owner[:-3]}`"
        how = f"it calls `{model.code(reach.call.func)}` at line {model.line(reach.call)}"
        switch = f"switch `requires_grad` off for {network} during the other loss"
    else:
        network = f"`{reach.owner}`"
        how = (
            f"it calls `{model.code(reach.call.func)}`, which holds {network}" if reach.through is not None
            else f"it calls {network} at line {model.line(reach.call)}"
        )
        switch = f"switch {network}'s `requires_grad` off for the other loss"
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
