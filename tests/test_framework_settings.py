"""What the settings walk reads: base classes a factory makes, and configurations read by key."""

from __future__ import annotations

import textwrap

import pytest

from gradlint.linter import lint_text

_COMPUTE_LOSS = """
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            logits, labels = outputs.logits, inputs["labels"]
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
            return (loss, outputs) if return_outputs else loss
"""


def _trainer_module(setup: str, base: str) -> str:
    head = textwrap.dedent(
        """\
        import torch.nn.functional as F
        from transformers import AutoModelForCausalLM, Trainer
        from trl import SFTTrainer
        from mylib.trainers import CustomTrainer
        """
    )
    return head + textwrap.dedent(setup) + f"\n\nclass TokenTrainer({base}):\n" + textwrap.indent(textwrap.dedent(_COMPUTE_LOSS), "    ")


def _gl008(text: str) -> list[int]:
    return [f.line for f in lint_text(text, "trainer.py").findings if f.code == "GL008"]


@pytest.mark.parametrize(
    "setup",
    [
        "base_cls = SFTTrainer if True else Trainer",
        "def pick(sft):\n    if sft:\n        return SFTTrainer\n    return Trainer\n\nbase_cls = pick(True)",
        "def pick():\n    return Trainer\n\nchosen = pick()\nbase_cls = chosen",
    ],
)
def test_a_base_class_every_way_of_which_is_a_trainer_is_followed(setup):
    assert len(_gl008(_trainer_module(setup, "base_cls"))) == 1


@pytest.mark.parametrize(
    "setup",
    [
        "base_cls = CustomTrainer if True else Trainer",
        "def pick(sft):\n    return Trainer if sft else CustomTrainer\n\nbase_cls = pick(True)",
        "base_cls = load_trainer_class()",
    ],
)
def test_a_factory_that_may_give_another_class_is_not_followed(setup):
    assert _gl008(_trainer_module(setup, "base_cls")) == []


def test_a_class_defined_in_a_factory_is_a_trainer_when_every_call_hands_it_one():
    body = textwrap.indent(f"class TokenTrainer(parent):\n{textwrap.indent(textwrap.dedent(_COMPUTE_LOSS), '    ')}", "    ")
    head = "import torch.nn.functional as F\nfrom transformers import AutoModelForCausalLM, Trainer\nfrom trl import SFTTrainer\n"
    factory = f"{head}\n\ndef make(parent):\n{body}\n    return TokenTrainer\n\n"
    assert len(_gl008(factory + "A = make(SFTTrainer)\nB = make(parent=Trainer)\n")) == 1
    assert _gl008(factory + "A = make(SFTTrainer)\nB = make(object)\n") == []
    assert _gl008(factory) == []  # never called: nothing says what it derives from
