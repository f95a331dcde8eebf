"""Building the loop model of one parsed module: module index, then events and gradient-release set-ups."""

from __future__ import annotations

import libcst as cst

from gradlint.event_builder import EventBuilder
from gradlint.model import LoopModel, Root
from gradlint.module_index import ModuleIndex
from gradlint.release_setups import find_release


def build_model(module: cst.Module, text: str | None = None) -> LoopModel:
    """Build the loop model of one parsed module; ``text``, its source when the caller has it, saves regenerating it."""
    index = ModuleIndex(module)
    index.text = text
    builder = EventBuilder(index)
    roots = [Root("<module>", module, builder.root_events(None))]
    for function in index.functions:
        roots.append(Root(index.qualname[function], function, builder.root_events(function)))
    roots = [r for r in roots if r.events]
    return LoopModel(
        module=module,
        objects=index.objects,
        roots=roots,
        uses_cuda_graphs=index.uses_cuda_graphs,
        release=find_release(index),
        text=text,
        index=index,
    )
