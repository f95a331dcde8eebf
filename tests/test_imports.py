"""Names resolve through every import spelling to the same qualified name."""

from __future__ import annotations

import libcst as cst
import pytest

from gradlint.imports import ImportMap


def qualify(source: str, expression: str) -> set[str]:
    imports = ImportMap()
    for statement in cst.parse_module(source).body:
        for small in getattr(statement, "body", []):
            if isinstance(small, (cst.Import, cst.ImportFrom)):
                imports.add(small)
    return imports.qualify(cst.parse_expression(expression))


@pytest.mark.parametrize(
    "source, expression",
    [
        ("import torch", "torch.optim.AdamW"),
        ("import torch.optim", "torch.optim.AdamW"),
        ("import torch.optim as optim", "optim.AdamW"),
        ("from torch import optim", "optim.AdamW"),
        ("from torch.optim import AdamW", "AdamW"),
        ("from torch.optim import AdamW as Adam_W", "Adam_W"),
        ("from torch.optim import *", "AdamW"),
    ],
)
def test_every_spelling_resolves_to_the_qualified_name(source, expression):
    assert qualify(source, expression) == {"torch.optim.AdamW"}


def test_local_and_relative_names_do_not_resolve():
    assert qualify("from .optim import AdamW", "AdamW") == set()
    assert qualify("import torch", "AdamW") == set()
    assert qualify("import torch", "model.step") == set()


def test_a_star_import_of_torch_optim_binds_only_what_it_exports():
    source = "from torch.optim import *\nfrom torch.optim.lr_scheduler import *\nfrom project.utils import *"
    # matchmaker's ``EarlyStopping`` comes from the project's own star import, not from torch's modules
    assert qualify(source, "EarlyStopping") == {"project.utils.EarlyStopping"}
    assert qualify(source, "AdamW") == {"torch.optim.AdamW", "project.utils.AdamW"}
    assert qualify(source, "StepLR") == {"torch.optim.lr_scheduler.StepLR", "project.utils.StepLR"}


def test_a_star_imported_name_torch_does_not_export_builds_no_tracked_object():
    from gradlint.module_index import ModuleIndex
    from gradlint.objects import ObjKind
    from gradlint.parsed_file import ParsedFile

    source = (
        "from torch.optim import *\nfrom torch.optim.lr_scheduler import *\nfrom project.utils import *\n"
        "stopper = EarlyStopping(patience=3)\nopt = AdamW(params)\n"
    )
    index = ModuleIndex(ParsedFile(cst.parse_module(source)))
    assert {name: info.kind for name, info in index.objects.items()} == {"opt": ObjKind.OPTIMIZER}
