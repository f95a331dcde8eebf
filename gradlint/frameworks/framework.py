"""What a framework module declares: what its calls do, in the loop model's neutral terms.

Each module of :mod:`gradlint.frameworks` builds one :class:`Framework`.
Every field is optional: a framework declares only what it has. The event
builder, the module index, the project index, the release walk and the
rules read these declarations through the registry
(:mod:`gradlint.frameworks`), never a framework's own names.

The terms, and who reads them:

- objects (:class:`Framework.builds`, ``optimizer_modules``, ``named``,
  ``returns_given``, ``returns_by_position``): what its constructors and
  calls return (:mod:`gradlint.objects`, :mod:`gradlint.module_index`);
- :class:`Backward`: a call that backpropagates the loss, and whether it
  divides it by the framework's accumulation count and decides the
  all-reduce itself (the event builder; GL004, GL007, GL301, GL302);
- :class:`NoSyncContext`, :class:`SyncSwitch`, :class:`SyncFlag`: ways to
  keep a backward from all-reducing (the event builder; GL302, GL304, GL305);
- :class:`AccumulateContext`: a block in which the framework decides the
  micro-batches, its prepared optimizers and schedulers stepping and
  clearing only on the one that syncs (GL003, GL006, GL301, GL302), and
  its :class:`UnscalingClip`, a clip that unscales through the framework's
  ``GradScaler`` on every call (GL105);
- :class:`Wrap`: a call that wraps a model so that its backward
  all-reduces, and the framework's spelling of how to skip that for the
  micro-batches that do not step (the project index; GL302, GL303);
- :class:`AccumulationSetting`, :class:`ConfigSetting`, :class:`Subclasses`:
  what one walk of the module reads (:mod:`gradlint.frameworks.settings`);
- :class:`ReturnedLoss`, :class:`LossHook`: methods the framework calls,
  whose returned loss it divides, or does not (GL007, GL008);
- :class:`ReleaseCall`: a gradient-release set-up (:mod:`gradlint.release_setups`; GL201-GL204);
- ``owns_backwards_of``: classes whose methods' backwards the framework
  divides for itself (GL007 leaves them alone);
- ``clip_methods``, ``clip_owner_kinds``,
  ``comm_hooks``, ``averaging_steps``, ``clearing_steps``, ``step_functions``,
  ``loss_scalers``, ``per_batch``: the rest of what the event builder,
  the model builder and GL301 ask.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from gradlint.kinds import ObjKind

if TYPE_CHECKING:
    from gradlint.model import LoopModel
    from gradlint.module_index import ModuleIndex
    from gradlint.parsed_file import ParsedFile


@dataclasses.dataclass(frozen=True)
class CountSetting:
    """How a dividing backward's accumulation count is spelled, for GL007 (the loss divided twice)."""

    settings: str  # whose :class:`AccumulationSetting`/:class:`ConfigSetting` values hold the count
    tokens: tuple[str, ...]  # what a file must spell for the count to be set (a rule's prefilter tokens)
    # ``divisor, owner -> bool``: the divisor is the count as the object that backpropagates holds it
    own_count: Callable[[cst.BaseExpression, str], bool]
    divides_again: str  # ``{call}`` divides it again (...): how the message says the framework divides too
    # ``call -> bool``: the call asks the framework not to divide (``scale_wrt_gas=False``)
    opted_out: Callable[[cst.Call], bool] | None = None
    # ``model, divisor -> node``: where the module reads the divisor from another engine's configuration that divides
    # by it as well; and the message then (``divisor code, line, call code``)
    read_elsewhere: Callable[[LoopModel, cst.BaseExpression], cst.CSTNode | None] | None = None
    read_elsewhere_message: Callable[[str, int, str], str] | None = None
    # The accumulation context (an :class:`AccumulateContext` method) outside which the framework holds no step back:
    # its prepared optimizer steps on every call there while the backward still divides; and the message for a loop
    # that divides so and steps every batch (step code, backward code, line of the backward, count code, line of the count)
    held_back_only_in: str | None = None
    unheld_message: Callable[[str, str, int, str, int], str] | None = None
    # The message for a loop that steps on every pass inside that context entered once around the loop, which decides
    # once per entry (step code, line of the context, line of the loop, count code, line of the count)
    entered_around_message: Callable[[str, int, int, str, int], str] | None = None


@dataclasses.dataclass(frozen=True)
class Backward:
    """A call through which a framework backpropagates the loss: ``owner.method(loss)``.

    A call matches by the receiver's last name (``owners``) first, whatever
    framework declares it; then, framework by framework in the registry's
    order, by the receiver's kind (``owner_kinds``) or spelling (``owner_pattern``).
    """

    by: str | None  # the event's ``framework``: who does the bookkeeping (None: nobody, the loss goes through as is)
    method: str = "backward"
    owners: frozenset[str] = frozenset()
    owner_kinds: frozenset[ObjKind] = frozenset()
    owner_pattern: re.Pattern[str] | None = None
    any_owner: bool = False  # the method alone says it, whatever the receiver (and with no loss handed)
    divides_by_count: bool = False  # divides the loss by the framework's accumulation count: it needs no division
    divides_outputs: bool = False  # a plain ``.backward()`` of what the owner returns when called is divided as well
    decides_sync: bool = False  # decides itself when to all-reduce (at its own accumulation boundary)
    count: CountSetting | None = None


@dataclasses.dataclass(frozen=True)
class NoSyncContext:
    """A context manager inside which a backward does not all-reduce: ``model.no_sync()``.

    ``model_argument`` is where the call names the model: a position among
    its arguments, or None for the receiver (a method of the wrapped model,
    often picked into a variable and entered later, chosen by a test).
    """

    method: str
    model_argument: int | None = None


@dataclasses.dataclass(frozen=True)
class ShardedGrads:
    """A wrapper class after whose backward each rank holds only a shard of every gradient (FSDP1's flat shards).

    A plain norm-clipping function handed the wrapper's ``parameters()``
    measures the norm of this rank's shard alone and scales each shard by
    its own factor; the wrapper's own method (``clip_method``) reduces the
    norm over the ranks first. A wrapper built with ``strategy_keyword``
    given a value whose last name is in ``unsharded`` keeps whole gradients,
    and the plain function is right there; without the keyword the strategy
    is ``default`` (sharded).
    """

    constructors: frozenset[str]
    strategy_keyword: str
    unsharded: frozenset[str]
    default: str
    clip_method: str
    short: str  # how messages name the wrapper
    norm_clips: frozenset[str]  # qualified names of the plain norm-clipping functions that read one rank's gradients


@dataclasses.dataclass(frozen=True)
class SyncSwitch:
    """A call that switches the all-reduce off until switched on again (``model.disable_allreduce()``)."""

    method: str
    switches_off: Callable[[cst.Call], bool]  # whether this call (its arguments) switches it off


@dataclasses.dataclass(frozen=True)
class SyncFlag:
    """An attribute of the wrapped model that says whether the coming backward all-reduces.

    The wrapper reads it in the forward (only then does it prepare the
    all-reduce): set after the forward, it applies to the next micro-batch.
    """

    attribute: str
    applied_by: str  # the call that applies the flag after a forward, when a loop makes it itself
    reader: str  # how messages name the wrapper that reads it


@dataclasses.dataclass(frozen=True)
class UnscalingClip:
    """A framework's clip that unscales the gradients through the framework's ``GradScaler`` each time it runs, with
    no ``update()`` until the framework's own step: run on a micro-batch that does not step, the next one's clip
    unscales again, and ``GradScaler.unscale_`` raises (GL105)."""

    by: str  # the clip event's ``framework`` (the key of the clip's owner kind)
    # ``model -> node``: where the module shows the scaler on and more than one micro-batch per step (the
    # framework's object built with float16 and an accumulation count), or None when it does not
    scaler_on: Callable[[LoopModel], cst.CSTNode | None]
    message: Callable[[str, int, int], str]  # clip code, line of the accumulation block, line that shows the scaler on
    tokens: tuple[str, ...]  # what a file must spell for it (a rule's prefilter tokens)


@dataclasses.dataclass(frozen=True)
class AccumulateContext:
    """A ``with`` block in which the framework decides the micro-batches: it all-reduces only on the one that syncs,
    and the optimizers and schedulers it prepared step and clear only there.

    The messages are the framework's words for what the rules find inside
    such a block; each takes the code and lines the rule points at.
    """

    method: str  # the context manager's method (``with owner.method(model):``)
    settings: str  # whose :class:`AccumulationSetting` says whether it may accumulate at all
    sync_flag: str  # the attribute that is true on the micro-batch that syncs
    # ``file, function, last name -> bool``: the function hands an object of that last name to the framework's prepare
    prepared_in: Callable[[ParsedFile, cst.FunctionDef, str], bool]
    # ``index, scheduler, optimizer, owner -> bool``: the scheduler is certainly not prepared, the optimizer is
    certainly_unprepared: Callable[[ModuleIndex, str, str, str], bool]
    clip_message: Callable[[str, int], str]  # a clip on every micro-batch (clip code, block line)
    clear_message: Callable[[str, int, str], str]  # a plain clear on every micro-batch (clear code, block line, optimizer)
    # the prepared optimizer cleared before the block's backward (clear code, backward line, block line, step code)
    early_clear_message: Callable[[str, int, int, str], str]
    scheduler_message: Callable[[str, str], str]  # an unprepared scheduler stepped in the block (scheduler, optimizer)
    unscaling_clip: UnscalingClip | None = None  # the framework's clip, when it unscales through the framework's scaler
    # a plain ``loss.backward()`` in the block, when only the framework's own backward divides by the count
    # (backward code, block line); None where the block itself divides
    plain_backward_message: Callable[[str, int], str] | None = None


@dataclasses.dataclass(frozen=True)
class Wrap:
    """A call that wraps a model so that its backward all-reduces (or reduce-scatters) the gradients.

    ``key`` names the wrap in the project index's ``wrapped:`` facts. A wrap
    is one of: a wrapper class (``constructors``; the project index, which
    reads Python's tree without imports, matches ``class_name`` and its
    aliases), a sharding function (``function``, of a module under
    ``function_module``), or a method of a framework's object
    (``prepare_methods``, on an object of kind PREPARER; the project index
    matches ``owner_names``).
    """

    key: str
    # ``name, where -> str``: GL302's message, the framework's spelling of the fix; ``where`` says when the optimizer steps
    message: Callable[[str, str], str]
    constructors: frozenset[str] = frozenset()
    class_name: str | None = None
    # A class of this name whose constructors come from modules under this prefix is this wrap, not another's of the
    # same name (the project index, reading no imports, takes it for the first wrap that declares the name).
    constructor_prefix: str | None = None
    function: str | None = None
    function_module: str | None = None
    prepare_methods: frozenset[str] = frozenset()
    owner_names: frozenset[str] = frozenset()
    wrapper_object: bool = False  # returns a new object around the module: a loop that calls the module bypasses it
    hooks_at_wrap: bool = False  # registers the all-reduce hooks on the parameters' gradient accumulators when wrapping
    short: str = ""  # how messages name a model it wrapped (``DDP``)
    # ``arguments of a constructor call of the owner -> bool`` (:func:`literal_arguments`): every framework object was
    # built so that nothing is all-reduced (one process, a plugin that shards instead): a prepared model is then no
    # data-parallel one. Read on LibCST's calls by the rules and on Python's by the project index.
    quiet_when_built: Callable[[dict[str, object]], bool] | None = None
    # ``arguments of the wrapping call -> bool``: this call wraps nothing (``prepare_model(model, parallel_strategy=None)``),
    # or what it wraps in cannot be told (a strategy held in a variable): not read as a wrap
    leaves_unwrapped: Callable[[dict[str, object]], bool] | None = None
    # ``model -> bool``: the module runs the wrap where it all-reduces nothing as DDP does: on one process only
    # (``ScalingConfig(num_workers=1)``), or under another engine the module's own code requires (a DeepSpeed plugin)
    reduces_nothing: Callable[[LoopModel], bool] | None = None
    # ``arguments of the wrapping call -> bool``: the wrapper decides in the forward whether the coming backward
    # all-reduces (torch DDP's ``_post_forward`` arms the reducer only while ``require_backward_grad_sync`` is true),
    # so a ``no_sync()`` entered after the forward changes nothing (GL306). None: it decides in the backward (FSDP,
    # fairscale's ShardedDataParallel), or it cannot be told.
    arms_in_forward: Callable[[dict[str, object]], bool] | None = None
    forward_decides: str = ""  # how GL306's message says the wrapper decides in the forward (its own names)
    # What a training loss computed around the wrapped model (through ``wrapped.module``, or the object it was built
    # from) skips, in the framework's words, for GL309; empty: not known to skip its reduction that way.
    around_forward: str = ""
    # ``model, count -> bool``: the accumulation count says another engine of the framework, not this wrap, reduces
    quiet_for_count: Callable[[LoopModel, cst.BaseExpression | None], bool] | None = None
    tokens: tuple[str, ...] = ()  # what a file must spell to wrap a model so (a rule's prefilter tokens)


# In :func:`literal_arguments`, the value of an argument that is no literal; ``"**"`` maps to it when ``**kwargs``
# is handed on, ``"*"`` when ``*args`` is.
NOT_LITERAL = Ellipsis


def literal_arguments(call: cst.Call) -> dict[str, object]:
    """A LibCST call's arguments by keyword, and by position as ``"0"``, ``"1"``...: each literal's value
    (``devices=1`` → 1, ``devices=[0]`` → [0], ``parallel_strategy=None`` → None), or :data:`NOT_LITERAL`.
    The project index reads Python's calls the same way (``project_index._literal_arguments``)."""
    found: dict[str, object] = {}
    position = 0
    for arg in call.args:
        if arg.star:
            found[arg.star] = NOT_LITERAL
            continue
        key = arg.keyword.value if arg.keyword is not None else str(position)
        if arg.keyword is None:
            position += 1
        try:
            found[key] = ast.literal_eval(cst.Module([]).code_for_node(arg.value).strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            found[key] = NOT_LITERAL
    return found


@dataclasses.dataclass(frozen=True)
class AccumulationSetting:
    """A constructor whose keyword argument sets the framework's accumulation count (``Accelerator(gradient_accumulation_steps=N)``)."""

    constructors: frozenset[str]
    keyword: str
    # Keywords that let it accumulate however the count is given (a plugin); ``**kwargs`` may hold anything.
    may_accumulate_keywords: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ConfigSetting:
    """A function handed a configuration dict whose key sets the accumulation count (``initialize(config={...})``)."""

    functions: frozenset[str]
    keywords: tuple[str, ...]  # the arguments that hand over the configuration
    key: str


@dataclasses.dataclass(frozen=True)
class Subclasses:
    """Classes of the module that derive from one of ``bases`` (directly or through classes of the module)."""

    role: str  # under which name the settings keep them
    bases: frozenset[str]


@dataclasses.dataclass(frozen=True)
class ReturnedLoss:
    """A method the framework calls once per batch, whose returned loss it backpropagates, divided by its count."""

    classes: str  # the :class:`Subclasses` role of the classes that define it
    method: str
    tokens: tuple[str, ...]  # what a file must spell for it (a rule's prefilter tokens)
    settings: str  # whose :class:`AccumulationSetting` values hold the count
    own_count: str  # the count as the method reads it from the framework
    divides_again: str  # how the message says the framework divides too
    manual: Callable[[cst.ClassDef], bool]  # the class takes the gradient work in hand: nothing is divided for it


@dataclasses.dataclass(frozen=True)
class SchedulersLeftToModule:
    """Under manual optimization the framework steps none of the schedulers a hook returns: the module must."""

    classes: str  # the :class:`Subclasses` role of the classes that define the hook
    hook: str  # the method returning optimizers and schedulers (``configure_optimizers``)
    manual: Callable[[cst.ClassDef], bool]  # the class takes the gradient work in hand
    fetch: str  # the method that hands the schedulers back (``lr_schedulers``)
    tokens: tuple[str, ...]  # what a file must spell for it (a rule's prefilter tokens)
    words: str  # how messages say who steps nothing
    step_hook: str = ""  # the method run once per batch where the module steps its optimizers (``training_step``)
    # the module's hooks the framework calls only when it does the gradient work itself: what they do never runs
    uncalled_hooks: tuple[str, ...] = ()
    # the tests under which the class takes the gradient work in hand, when it does so only under tests
    manual_under: Callable[[cst.ClassDef], frozenset[str]] | None = None


@dataclasses.dataclass(frozen=True)
class OptimizersReturned:
    """A method of the framework's module classes whose return value is the optimizers the framework steps: one that
    builds an optimizer and returns nothing leaves the framework none to step."""

    classes: str  # the :class:`Subclasses` role of the classes that define the hook
    hook: str  # ``configure_optimizers``
    none_returned: str  # what the framework does when the hook returns nothing (for messages)


@dataclasses.dataclass(frozen=True)
class LossHook:
    """A method the framework calls for the loss, handed the number of items of the whole accumulated batch.

    ``skips_division`` says whether the framework visibly takes what the
    method returns as normalised and does not divide it by the accumulation
    steps (the hook's own loss left undivided): ``model, class, method,
    classes of the module by name, settings -> bool``.
    """

    classes: str  # the :class:`Subclasses` role of the classes that define it
    method: str
    count_parameter: str
    tokens: tuple[str, ...]  # what a file must spell for it (a rule's prefilter tokens)
    skips_division: Callable[..., bool]
    token_mean_message: Callable[[str, int, bool], str]  # class name, line, skips_division -> message
    undivided_message: Callable[[str], str]  # class name -> message


@dataclasses.dataclass(frozen=True)
class ReleaseCall:
    """A call that sets gradient release up: each parameter steps from a hook as its gradient completes.

    ``optimizer`` and ``model`` say where the call names them: argument
    positions and keywords, ``"assigned"`` (the name the call is assigned
    to) or ``"parameters"`` (the owner of the ``.parameters()`` it is handed).
    """

    names: frozenset[str]
    style: str
    optimizer: tuple[tuple[int, str], ...] | str = ()
    model: tuple[int, str] | str | None = None


@dataclasses.dataclass(frozen=True)
class ReleaseStyle:
    """How messages name a set-up of one style, and what is known of it."""

    style: str
    describe: Callable[[str | None, int], str]  # callee, line -> words
    names_its_optimizer: bool = False  # a set-up names the one optimizer it releases


@dataclasses.dataclass(frozen=True)
class LayerFamily:
    """Layer classes of a library that hold learnable parameters, by where they live and how they are named
    (``torch_geometric.nn`` classes ending in ``Conv``), less those of the family that hold none."""

    module: str  # the module prefix their qualified names start with
    suffix: str  # the end of each class's name
    without: frozenset[str] = frozenset()  # names of the family that hold no parameter


@dataclasses.dataclass(frozen=True)
class OptimizerBuiltBySuper:
    """Base classes whose methods build the optimizer over ``self.parameters()``: a subclass's override that calls
    ``super().method(...)`` and then builds new layers leaves them out of it (GL028)."""

    bases: frozenset[str]  # qualified names of the base classes
    methods: frozenset[str]  # the methods whose ``super()`` call builds it (``__init__`` runs ``_build``)
    optimizer: str  # the attribute it is stored in (``self.optimizer``)
    rebuild: str  # how the library's own code builds it, for the message
    tokens: tuple[str, ...]  # what a file must spell for the base to be one of these (a rule's prefilter tokens)


@dataclasses.dataclass(frozen=True)
class Framework:
    """Everything one framework module declares (see the module docstring for the terms)."""

    name: str
    # -- objects
    builds: dict[str, ObjKind] = dataclasses.field(default_factory=dict)  # constructors by qualified name
    optimizer_modules: tuple[str, ...] = ()  # module prefixes whose capitalised callables build optimizers
    schedule_factory_modules: tuple[str, ...] = ()  # modules whose ``get_*schedule*`` functions build schedulers
    named: dict[str, ObjKind] = dataclasses.field(default_factory=dict)  # an object's last name that says its kind
    returns_given: frozenset[str] = frozenset()  # calls returning what they are handed, element by element
    returns_given_alone: frozenset[str] = frozenset()  # calls that, handed one object, return it
    # calls by qualified name whose returned tuple holds, at a position, an object of a kind (``deepspeed.initialize``)
    returns_by_position: dict[str, dict[int, ObjKind]] = dataclasses.field(default_factory=dict)
    # -- backward, sync, accumulation
    backwards: tuple[Backward, ...] = ()
    no_sync: tuple[NoSyncContext, ...] = ()
    sync_switches: tuple[SyncSwitch, ...] = ()
    sync_flags: tuple[SyncFlag, ...] = ()
    accumulate: tuple[AccumulateContext, ...] = ()
    wraps: tuple[Wrap, ...] = ()
    sharded_grads: tuple[ShardedGrads, ...] = ()  # wrappers whose ranks hold shards of each gradient
    # -- settings read by one walk of the module
    accumulation_settings: dict[str, AccumulationSetting] = dataclasses.field(default_factory=dict)
    config_settings: dict[str, ConfigSetting] = dataclasses.field(default_factory=dict)
    subclasses: tuple[Subclasses, ...] = ()
    returned_losses: tuple[ReturnedLoss, ...] = ()
    loss_hooks: tuple[LossHook, ...] = ()
    schedulers_left: tuple[SchedulersLeftToModule, ...] = ()
    optimizers_returned: tuple[OptimizersReturned, ...] = ()  # hooks that hand the framework the optimizers it steps
    # The :class:`Subclasses` roles of classes whose methods' backwards are the framework's business (it divides itself).
    owns_backwards_of: tuple[str, ...] = ()
    # -- the rest the event builder and the model builder ask
    clip_methods: frozenset[str] = frozenset()  # clipping calls of its own (whatever the receiver)
    clip_owner_kinds: dict[ObjKind, str] = dataclasses.field(default_factory=dict)  # a clip on such a receiver is ``by``'s
    # Methods of a wrapped model that install a communication hook: ``method -> (position, keyword)`` of the hook;
    # a hook that divides by more than the world size normalises the accumulated gradients as it all-reduces them.
    comm_hooks: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    averaging_steps: frozenset[str] = frozenset()  # an optimizer's method that averages the accumulated gradients itself
    # Constructors (qualified names) of optimizers whose ``step()`` clears the gradients after stepping
    clearing_steps: frozenset[str] = frozenset()
    # Per-batch hooks the framework calls, and the position of the argument that counts the batches of the current
    # pass over the data from 0 (Lightning's ``training_step(self, batch, batch_idx)``: position 2)
    pass_index: dict[str, int] = dataclasses.field(default_factory=dict)
    step_functions: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> module prefix: steps its first argument
    loss_scalers: frozenset[str] = frozenset()  # calls that multiply the loss they are handed by a loss scale
    # ``index -> {function: why}``: functions the framework calls once per batch, leaving them the gradient work
    per_batch: Callable[[ModuleIndex], dict[cst.FunctionDef, str]] | None = None
    # ``index -> {function: names}``: settings the framework holds at 1 while a function runs, by their dotted names
    # (Lightning refuses ``accumulate_grad_batches`` above 1 under manual optimization, so a manual module's
    # ``self.trainer.accumulate_grad_batches`` is 1): a remainder by one is always 0
    counts_at_one: Callable[[ModuleIndex], dict[cst.FunctionDef, frozenset[str]]] | None = None
    # Attributes of the framework's objects that are true on the last batch of an epoch only (``trainer.is_last_batch``):
    # a branch that needs one runs once per pass over the data (GL301)
    epoch_end_flags: frozenset[str] = frozenset()
    # ``method -> hook``: ``self.method()`` returns the optimizers the module's ``hook`` returns, in their order
    # (``opt_g, opt_d = self.optimizers()`` with ``configure_optimizers`` returning ``[opt_g, opt_d]``)
    optimizers_of_hook: dict[str, str] = dataclasses.field(default_factory=dict)
    # Methods that set ``requires_grad = False`` on parameters other than an optimizer's for the next backward
    # (Lightning's ``toggle_optimizer``): another loss's backward leaves those parameters alone
    grad_toggles: frozenset[str] = frozenset()
    # Methods handed an optimizer that neither step nor clear it (Lightning's ``toggle_optimizer`` and
    # ``untoggle_optimizer`` only switch ``requires_grad`` of parameters: ``core/module.py``)
    keeps_gradients: frozenset[str] = frozenset()
    # Methods the framework calls between the backward and the optimizer step (``on_before_optimizer_step``): what
    # they do to the gradients, the step sees
    hooks_before_step: frozenset[str] = frozenset()
    # Layer classes that hold learnable parameters (GL018, GL027: a plain list of them is not registered)
    layers_with_parameters: tuple[LayerFamily, ...] = ()
    # Base classes whose methods build the optimizer themselves (GL028: layers built after ``super().method()``)
    optimizer_built_by_super: tuple[OptimizerBuiltBySuper, ...] = ()
    # -- gradient release
    release_calls: tuple[ReleaseCall, ...] = ()
    release_keyword: tuple[str, str] | None = None  # (keyword, style): a constructor given it releases
    release_styles: tuple[ReleaseStyle, ...] = ()
    release_tokens: tuple[str, ...] = ()  # substrings every set-up of this framework contains
    release_accumulation_fix: str | None = None  # how a message says to accumulate under release
    release_accumulates_into: str | None = None  # the optimizer attribute that switches that on
    release_clipping_fix: str | None = None  # how a message says to clip under release

    def settings_names(self) -> tuple[str, ...]:
        """The last part of every qualified name its settings walk matches (for the walk's shortcut)."""
        names: list[str] = []
        for setting in self.accumulation_settings.values():
            names.extend(n.rsplit(".", 1)[-1] for n in setting.constructors)
        for setting in self.config_settings.values():
            names.extend(n.rsplit(".", 1)[-1] for n in setting.functions)
        for subclasses in self.subclasses:
            names.extend(n.rsplit(".", 1)[-1] for n in subclasses.bases)
        for wrap in self.wraps:
            names.extend(n.rsplit(".", 1)[-1] for n in wrap.constructors)
            if wrap.function is not None:
                names.append(wrap.function)
        return tuple(dict.fromkeys(names))

