"""A finding that needs a count raised above its shipped default of 1 says so: what the declarations tell."""

from __future__ import annotations

import textwrap

from gradlint import runner
from gradlint.config import Config
from gradlint.linter import lint_text
from gradlint.project_index import python_tree
from gradlint.setting_defaults import declared_defaults

LATENT = "(this needs `args.accum_steps` above 1: it is declared with the default 1)"

LOOP = """
import torch

def train(model, loader, optimizer, args):
    for step, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % args.accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def _declared(source: str) -> frozenset[str]:
    return declared_defaults(python_tree(textwrap.dedent(source)))


def test_declarations_by_argparse_dataclass_class_body_and_dict_are_read():
    found = _declared("""
        import dataclasses
        parser.add_argument("--gradient-accumulation-steps", "--gas", type=int, default=1)
        parser.add_argument("-a", dest="accum", default=1)
        parser.add_argument("--batch_size", type=int, default=32)
        parser.add_argument("--update_freq", type=int)
        @dataclasses.dataclass
        class Config:
            grad_accum: int = 1
            micro: int = dataclasses.field(default=1)
            epochs = 10
        settings = {"accumulate_grad_batches": 1}
    """)
    assert found == {
        "gradient_accumulation_steps=1", "accum=1", "batch_size=*", "grad_accum=1", "micro=1", "epochs=*",
        "accumulate_grad_batches=1",
    }


def test_two_different_defaults_of_one_name_in_a_file_are_a_conflict():
    assert _declared("""
        parser.add_argument("--accum", default=1)
        other.add_argument("--accum", default=4)
    """) == {"accum=*"}


def test_a_count_declared_at_one_in_the_same_file_makes_the_finding_latent():
    source = 'import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument("--accum_steps", type=int, default=1)\n' + LOOP
    messages = {f.code: f.message for f in lint_text(source).findings}
    assert set(messages) == {"GL004", "GL006"}
    assert all(m.endswith(LATENT) for m in messages.values())


def test_a_count_declared_with_another_default_or_not_at_all_says_nothing():
    for declaration in ('parser.add_argument("--accum_steps", type=int, default=4)\n', ""):
        findings = lint_text("import argparse\nparser = argparse.ArgumentParser()\n" + declaration + LOOP).findings
        assert {f.code for f in findings} == {"GL004", "GL006"}
        assert not any("declared with the default" in f.message for f in findings)


def test_a_count_read_through_a_local_name_is_followed_to_its_setting():
    source = (
        'parser.add_argument("--accum_steps", type=int, default=1)\n'
        + LOOP.replace("def train(model, loader, optimizer, args):\n", "def train(model, loader, optimizer, args):\n    accum = args.accum_steps\n")
        .replace("% args.accum_steps", "% accum")
    )
    findings = lint_text(source).findings
    assert findings and all(f.message.endswith(LATENT) for f in findings)


def test_the_default_declared_in_an_options_module_of_the_package_reaches_the_loop(tmp_path):
    package = tmp_path / "proj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "options.py").write_text(
        "import argparse\n\ndef get_args():\n    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--accum_steps', type=int, default=1)\n    return p.parse_args()\n"
    )
    (package / "train.py").write_text(LOOP)
    results = runner.run([str(package)], Config(root=tmp_path), jobs=1)
    findings = [f for r in results for f in r.findings]
    assert {f.code for f in findings} == {"GL004", "GL006"}
    assert all(f.message.endswith(LATENT) for f in findings)
    # a second declaration with another default in the package: the run may ship either
    (package / "config.py").write_text("from dataclasses import dataclass\n\n@dataclass\nclass C:\n    accum_steps: int = 8\n")
    results = runner.run([str(package)], Config(root=tmp_path), jobs=1)
    assert not any("declared with the default" in f.message for r in results for f in r.findings)
