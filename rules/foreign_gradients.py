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
from gradlint.queries import clears, exclusive, same_object
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
    the adversarial game is quietly broken.

    **Fix.** Clear the optimizer right before its own backward, or switch the
    other network's ``requires_grad`` off while the other loss is
    backpropagated (Lightning: ``toggle_optimizer``).

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
        reported: set[tuple[int, str]] = set()
        switched_off: dict[frozenset[str], bool] = {}
        for root in model.roots:
            for loop in _outer_loops(root):
                events = [e for e in root.events_in(loop) if e.kind in _BOOKKEEPING]
                steps = [e for e in events if _plain_optimizer_step(model, e)]
                if len({last_name(s.target) for s in steps}) < 2:
                    continue
                for step in steps:
                    key = (id(loop), last_name(step.target))
                    if key in reported:
                        continue
                    found = _leak_into(model, events, step)
                    if found is None:
                        continue
                    clear, foreign, stepper, own, reach = found
                    owners = frozenset({reach.owner})
                    if owners not in switched_off:
                        switched_off[owners] = requires_grad_switched_off(model, owners)
                    if switched_off[owners]:
                        continue
                    reported.add(key)
                    yield Report(
                        step.node, _leak_message(model, events, clear, foreign, stepper, own, step, reach),
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
    """``(clear, foreign backward, the optimizer it is stepped for, own backward, reach)`` when a backward stepped by
    another optimizer, since the last clear of ``step``'s optimizer (read back from the step, around the iteration),
    reaches that optimizer's network."""
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
        if event.kind in (EventKind.STEP, HANDOFF) and (event.target is None or same_object(event.target, optimizer)):
            return None  # stepped again with no clear between (GL001), or handed to code that may clear
        if event.kind is EventKind.BACKWARD and (wrapped or not exclusive(event, step)):
            window.append(event)
    if clear is None or len(window) < 2:
        return None
    owners = parameter_owners(model, optimizer)
    if not owners:
        return None
    own: list = []
    for backward in window:  # latest first: the optimizer's own backwards come before the other losses'
        stepped = _stepped_after(model, events, backward)
        if not stepped:
            continue
        if any(same_object(s, optimizer) for s in stepped):
            own.append(backward)
            continue
        if not own:
            return None  # a foreign backward nearest the step: no backward of its own to clear before
        others = frozenset().union(*(parameter_owners(model, s) for s in stepped))
        reach = reaching_call(model, backward, owners, others)
        if reach is None:
            continue
        if others and any(reaching_call(model, mine, others, owners) is not None for mine in own):
            continue  # its own loss runs through the other network too: the losses are mixed both ways, maybe on purpose
        return clear, backward, stepped[0], own[-1], reach
    return None


def _stepped_after(model: LoopModel, events: list, backward) -> list[str]:
    """The optimizers whose steps take this backward's gradients: those stepped after it, up to the next backward that
    follows a step (backwards piling up for one step share its optimizers)."""
    stepped: list[str] = []
    start = next(i for i, e in enumerate(events) if e is backward)
    for event in events[start + 1:]:
        if event.kind is EventKind.BACKWARD and stepped and not exclusive(event, backward):
            break
        if event.kind is EventKind.STEP and event.target is not None and not exclusive(event, backward):
            stepped.append(event.target)
    return stepped


def _leak_message(model: LoopModel, events: list, clear, foreign, stepper: str, own, step, reach) -> str:
    optimizer = step.target
    after_step = events.index(clear) > events.index(step)
    cleared = (
        f"only after its step, at line {model.line(clear.node)}" if after_step
        else f"at line {model.line(clear.node)}, before that backward"
    )
    network = f"`{reach.owner}`"
    how = (
        f"it calls `{model.code(reach.call.func)}`, which holds {network}" if reach.through is not None
        else f"it calls {network} at line {model.line(reach.call)}"
    )
    return (
        f"this step of `{optimizer}` also applies the gradients that the loss backpropagated at line "
        f"{model.line(foreign.node)} for `{stepper}` left on {network} ({how}): `{optimizer}` is cleared {cleared}; "
        f"clear it just before its own backward at line {model.line(own.node)}, or switch {network}'s "
        f"`requires_grad` off for the other loss"
    )
