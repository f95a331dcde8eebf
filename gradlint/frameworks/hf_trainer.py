"""Hugging Face transformers' ``Trainer`` (and trl's ``SFTTrainer``), and transformers' optimizers and schedules.

What it does to gradients. ``Trainer.training_step`` computes the loss
with ``compute_loss(model, inputs, num_items_in_batch=...)`` and hands it to
its accelerator's ``backward``, dividing it by the gradient accumulation
steps first only when the loss is not already normalised over the
accumulated batch: ``if (not self.model_accepts_loss_kwargs or
num_items_in_batch is None) and self.compute_loss_func is None: loss =
loss / self.current_gradient_accumulation_steps`` (4.49-4.52: ``if not
self.model_accepts_loss_kwargs and self.compute_loss_func is None``), with
``scale_wrt_gas=False`` under DeepSpeed. ``Trainer.__init__`` sets
``model_accepts_loss_kwargs`` from the model (whether its forward takes
``**kwargs``: transformers' causal LMs do), and ``compute_loss`` passes
``num_items_in_batch`` (the tokens of the whole accumulated batch) to such
a model. An override of ``compute_loss`` that returns a loss of its own,
computed without ``num_items_in_batch``, is then divided by nothing: each
step is the accumulation count times too large. trl's ``SFTTrainer``
derives from ``Trainer`` (through ``_BaseTrainer``), trains language models and leaves
``model_accepts_loss_kwargs`` as the Trainer sets it: a subclass of it is
a Trainer subclass here. trl's other trainers that derive from ``Trainer``
are not: ``DPOTrainer``, ``GRPOTrainer``, ``KTOTrainer``, ``RewardTrainer``
and ``RLOOTrainer`` (and the experimental BCO, CPO, ORPO, distillation...
trainers) set ``self.model_accepts_loss_kwargs = False`` in ``__init__``
("Since we compute our own loss ... to enable scaling"), so the Trainer
divides whatever their subclasses' ``compute_loss`` returns, and their
losses are preference or policy losses, no token means. A subclass's base
may come from a factory of the module (``class X(base_cls)``): the settings
walk follows it (:class:`gradlint.frameworks.settings._Factories`), and only
when every way gives one of these classes. The backwards of a
Trainer subclass's own methods are the Trainer's business (it divides
itself). ``transformers.AdamW``, ``Adafactor`` and
``transformers.optimization`` build optimizers; ``get_*schedule*``
functions of ``transformers``/``transformers.optimization`` build schedulers.

Where it was read: transformers ``src/transformers/trainer.py``
(``Trainer.training_step``, ``Trainer.compute_loss``) at commit 000945a9
of the repository, the ``current_gradient_accumulation_steps`` form above;
the behaviour of each release from 4.46 to 5 is as GL008's documentation
gives it (``training_step``, ``get_batch_samples``,
``_get_num_items_in_batch``), not read again for this module; trl
v1.9.0 (and the development head after it, commit f2cd5771)
``trl/trainer/sft_trainer.py`` (``class SFTTrainer(_BaseTrainer)``),
``trl/trainer/base_trainer.py`` (``class _BaseTrainer(Trainer)``), and the
``__init__`` of ``trl/trainer/{dpo,grpo,kto,reward,rloo}_trainer.py``
(``self.model_accepts_loss_kwargs = False``); transformers' ``training_step``
as quoted above was read again in the stored snapshot of
``src/transformers/trainer.py`` (``if (not self.model_accepts_loss_kwargs or
num_items_in_batch is None) and self.compute_loss_func is None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from gradlint.frameworks.framework import Framework, LossHook, Subclasses
from gradlint.kinds import ObjKind
from gradlint.syntax import class_methods, dotted_name

if TYPE_CHECKING:
    from gradlint.frameworks.settings import FrameworkSettings
    from gradlint.model import LoopModel
    from gradlint.parsed_file import ParsedFile

_TRAINER = frozenset({
    "transformers.Trainer",
    "transformers.trainer.Trainer",
    "transformers.Seq2SeqTrainer",
    "transformers.trainer_seq2seq.Seq2SeqTrainer",
})
# trl's SFTTrainer derives from transformers.Trainer and trains language models (causal LMs, and
# image-text-to-text models in later versions); it leaves ``model_accepts_loss_kwargs`` as the Trainer sets it.
_SFT_TRAINER = frozenset({"trl.SFTTrainer", "trl.trainer.SFTTrainer", "trl.trainer.sft_trainer.SFTTrainer"})

# The Trainer methods that decide whether the loss is divided by the accumulation steps (``training_step``)
# or what ``num_items_in_batch`` is (``get_batch_samples``, ``_get_num_items_in_batch``).
_SCALING_METHODS = {"training_step", "get_batch_samples", "_get_num_items_in_batch"}
# The Trainer attributes that say whether the loss is already scaled for accumulation, and the model
# attribute ``Trainer.__init__`` reads ``model_accepts_loss_kwargs`` from when the model has it.
_SCALING_FLAGS = ("model_accepts_loss_kwargs", "loss_is_scaled_for_ga", "accepts_loss_kwargs")


def _skips_division(
    model: LoopModel, cls: cst.ClassDef, function: cst.FunctionDef, local: dict[str, cst.ClassDef], settings: FrameworkSettings
) -> bool:
    """Whether the Trainer visibly takes ``compute_loss``'s own loss as normalised and skips the division by the steps.

    The module trains a language model (whose forward takes ``**kwargs``),
    nothing in it touches the Trainer's scaling flags or methods, and
    ``compute_loss`` does not read the accumulation steps.
    """
    if _touches_scaling_flag(model.file):
        return False
    if any(f.name.value in _SCALING_METHODS for c in _class_chain(cls, local) for f in class_methods(c)):
        return False
    if not _trains_language_model(model.file.code, cls, settings) or not _reads_logits(model.file, cls, local):
        return False
    if _model_without_kwargs(model.file, settings):
        return False
    return not _mentions_accumulation_steps(model.file, function)




def _touches_scaling_flag(parsed: ParsedFile) -> bool:
    """Whether the module names ``model_accepts_loss_kwargs`` or ``loss_is_scaled_for_ga`` in code (not in a comment or docstring).

    As an attribute (``self.model_accepts_loss_kwargs = False``, ``trainer.model_accepts_loss_kwargs = False``),
    a class attribute, or a string (``setattr(trainer, "model_accepts_loss_kwargs", False)``): whatever the module
    does with the flag, it has taken the question in hand.
    """
    return parsed.once(_touches_scaling_flag, lambda: _names_scaling_flag(parsed))


def _names_scaling_flag(parsed: ParsedFile) -> bool:
    for node in parsed.every_node(parsed.module):
        kind = type(node)
        if kind is cst.Name and node.value in _SCALING_FLAGS:
            return True
        if kind is cst.SimpleString and node.evaluated_value in _SCALING_FLAGS:
            return True
    return False


def _class_chain(cls: cst.ClassDef, local: dict[str, cst.ClassDef]) -> list[cst.ClassDef]:
    """``cls`` and the Trainer subclasses of the module it derives from."""
    chain: list[cst.ClassDef] = []
    pending = [cls]
    while pending:
        current = pending.pop()
        if any(current is c for c in chain):
            continue
        chain.append(current)
        for arg in current.bases:
            name = dotted_name(arg.value)
            if name in local:
                pending.append(local[name])
    return chain


def _trains_language_model(text: str, cls: cst.ClassDef, settings: FrameworkSettings) -> bool:
    """Whether the module shows a causal language model (whose forward takes ``**kwargs``) or the class is a trl SFTTrainer."""
    return "ForCausalLM" in text or "CAUSAL_LM" in text or any(cls is c for c in settings.classes_of("sft_trainer"))


def _reads_logits(parsed: ParsedFile, cls: cst.ClassDef, local: dict[str, cst.ClassDef]) -> bool:
    """Whether the class (or a Trainer base of the module) reads ``.logits``: the model it trains returns a transformers output."""
    return any(
        type(node) is cst.Attribute and node.attr.value == "logits" for c in _class_chain(cls, local) for node in parsed.every_node(c)
    )


def _model_without_kwargs(parsed: ParsedFile, settings: FrameworkSettings) -> bool:
    """Whether the module defines a model of its own whose ``forward`` takes no ``**kwargs``.

    It may be the model handed to the Trainer (a reward head around a causal
    LM, say): the Trainer then sets ``model_accepts_loss_kwargs = False``
    and divides.
    """
    trainers = {id(c) for c in settings.classes_of("trainer")}
    for node in parsed.every_node(parsed.module):
        if type(node) is cst.ClassDef and id(node) not in trainers:
            for function in class_methods(node):
                if function.name.value == "forward" and type(function.params.star_kwarg) is not cst.Param:
                    return True
    return False


def _mentions_accumulation_steps(parsed: ParsedFile, function: cst.FunctionDef) -> bool:
    """Whether ``compute_loss`` reads ``gradient_accumulation_steps`` (or ``current_gradient_accumulation_steps``)."""
    for node in parsed.walk(function.body, into_lambdas=True):
        if type(node) is cst.Name and "gradient_accumulation_steps" in node.value:
            return True
        if type(node) is cst.Attribute and "gradient_accumulation_steps" in node.attr.value:
            return True
        if type(node) is cst.SimpleString and "gradient_accumulation_steps" in node.value:
            return True
    return False


def _token_mean_message(cls: str, line: int, undivided: bool) -> str:
    also = (
        "; and for a model whose forward takes `**kwargs` (a causal LM) the Trainer takes it as "
        "normalised and does not divide it by the accumulation steps either"
        if undivided
        else ""
    )
    return (
        f"`{cls}.compute_loss` takes `num_items_in_batch` but never uses it and returns a "
        f"mean over this micro-batch's tokens (line {line}): under gradient accumulation a "
        f"token of a short batch weighs more than one of a long batch{also}; sum the token losses and divide "
        f"by `num_items_in_batch`"
    )


def _undivided_message(cls: str) -> str:
    return (
        f"`{cls}.compute_loss` returns a loss of its own and ignores `num_items_in_batch`, "
        f"while `model_accepts_loss_kwargs` keeps the value the Trainer read from the model's forward: "
        f"for a model whose forward takes `**kwargs` (transformers' causal LMs) the Trainer takes the loss "
        f"as already normalised over the accumulated batch and skips its division by the gradient "
        f"accumulation steps (transformers 4.49-4.52 always, 4.48 and 4.53 on when the batch has `labels`), "
        f"so every step is that many times too large; set `self.model_accepts_loss_kwargs = False` after "
        f"`super().__init__(...)`"
    )


FRAMEWORK = Framework(
    name="Hugging Face Trainer",
    builds={"transformers.AdamW": ObjKind.OPTIMIZER, "transformers.Adafactor": ObjKind.OPTIMIZER},
    optimizer_modules=("transformers.optimization.",),
    schedule_factory_modules=("transformers", "transformers.optimization"),
    subclasses=(Subclasses("trainer", _TRAINER | _SFT_TRAINER), Subclasses("sft_trainer", _SFT_TRAINER)),
    loss_hooks=(
        LossHook(
            "trainer", "compute_loss", "num_items_in_batch", tokens=("compute_loss", "num_items_in_batch"),
            skips_division=_skips_division, token_mean_message=_token_mean_message, undivided_message=_undivided_message,
        ),
    ),
    owns_backwards_of=("trainer",),
)
