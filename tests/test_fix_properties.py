"""Property test: fixing generated variants of the fixture loops always parses, settles, and removes the finding.

Each rule's loop is generated with renamed variables, extra statements,
comments, blank lines, different accumulation guards, and at module level or
inside a function.
"""

from __future__ import annotations

import ast
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradlint.fixer import fix_text
from gradlint.linter import lint_text

TEMPLATES = {
    "GL001": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {pre}
            {loss} = criterion({model}({x}), {y})
            {mid}
            {loss}.backward()
            {opt}.step()
            {post}
    """,
    "GL002": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {pre}
            {loss} = criterion({model}({x}), {y})
            {loss}.backward()
            {mid}
            {opt}.zero_grad()
            {opt}.step()
            {post}
    """,
    "GL003": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {opt}.zero_grad()
            {pre}
            {loss} = criterion({model}({x}), {y}) / {k}
            {mid}
            {loss}.backward()
            if {guard}:
                {opt}.step()
            {post}
    """,
    "GL004": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {pre}
            {loss} = criterion({model}({x}), {y})
            {mid}
            {loss}.backward()
            if {guard}:
                {opt}.step()
                {opt}.zero_grad()
            {post}
    """,
    "GL005": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {opt}.zero_grad(set_to_none=False)
            {pre}
            {loss} = criterion({model}({x}), {y})
            {mid}
            {loss}.backward()
            {opt}.step()
            {post}
    """,
    "GL101": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {opt}.zero_grad()
            {pre}
            {loss} = criterion({model}({x}), {y})
            {mid}
            {loss}.backward()
            {scaler}.step({opt})
            {scaler}.update()
            {post}
    """,
    "GL102": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {pre}
            {loss} = criterion({model}({x}), {y})
            {scaler}.scale({loss}).backward()
            {mid}
            {opt}.step()
            {opt}.zero_grad()
            {post}
    """,
    "GL103": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {pre}
            {loss} = criterion({model}({x}), {y})
            {scaler}.scale({loss}).backward()
            {mid}
            torch.nn.utils.clip_grad_norm_({model}.parameters(), 1.0)
            {scaler}.step({opt})
            {scaler}.update()
            {opt}.zero_grad()
            {post}
    """,
    "GL104": """
        for {i}, ({x}, {y}) in enumerate(loader):
            {pre}
            {loss} = criterion({model}({x}), {y}) / {k}
            {scaler}.scale({loss}).backward()
            {mid}
            if {guard}:
                {scaler}.step({opt})
                {opt}.zero_grad()
            {post}
    """,
}

HEADER = """\
import torch

{opt} = torch.optim.SGD({model}.parameters(), lr=0.1)
{scaler} = torch.amp.GradScaler()
"""

GUARDS = ["({i} + 1) % {k} == 0", "{i} % {k} == {k} - 1", "(({i} + 1) % {k}) == 0", "({i} + 1) % {k} == 0 or {i} == last"]
EXTRAS = [
    "print({i})",
    "{x} = {x}.to(device)",
    "seen += len({x})",
    "log.info('batch %d', {i})",
    "pass",
    "# a comment line",
    "",
    "metrics.update({{'i': {i}}})",
]

names = st.fixed_dictionaries(
    {
        "opt": st.sampled_from(["optimizer", "opt", "optim", "opt_g", "model_optimizer", "optimiser"]),
        "model": st.sampled_from(["model", "net", "encoder"]),
        "loss": st.sampled_from(["loss", "train_loss", "objective"]),
        "x": st.sampled_from(["x", "inputs", "images"]),
        "y": st.sampled_from(["y", "labels", "target"]),
        "i": st.sampled_from(["i", "it", "batch_idx"]),
        "k": st.sampled_from(["accum", "accum_steps", "grad_accum", "k"]),
        "scaler": st.sampled_from(["scaler", "grad_scaler", "amp_scaler"]),
    }
)
extras = st.lists(st.sampled_from(EXTRAS), max_size=2)
trailing = st.sampled_from(["", "  # note", "  # noqa: E501"])


@st.composite
def variants(draw, code):
    chosen = draw(names)
    chosen["guard"] = draw(st.sampled_from(GUARDS)).format(**chosen)
    slots = {}
    for slot in ("pre", "mid", "post"):
        lines = [line.format(**chosen) for line in draw(extras)] or ["pass"]
        slots[slot] = "\n".join(lines)
    body = textwrap.dedent(TEMPLATES[code]).strip("\n").format(**chosen, pre="{pre}", mid="{mid}", post="{post}")
    out = []
    for line in body.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        stripped = line.strip()
        if stripped in ("{pre}", "{mid}", "{post}"):
            out.extend(indent + extra if extra else "" for extra in slots[stripped[1:-1]].splitlines())
        elif stripped.endswith(")") and draw(st.booleans()):
            out.append(line + draw(trailing))
        else:
            out.append(line)
    loop = "\n".join(out) + "\n"
    if draw(st.booleans()):
        loop = "def train(loader, criterion, device, log, metrics, last):\n    seen = 0\n" + textwrap.indent(loop, "    ")
    return HEADER.format(**chosen) + "\n" + loop


def _codes(text):
    result = lint_text(text)
    assert result.error is None, result.error
    return {f.code for f in result.findings}


def _check(code, text):
    assert code in _codes(text), "the generated loop must show the bug"
    fixed = fix_text(text, unsafe=True)
    assert fixed.result.error is None, fixed.result.error
    ast.parse(fixed.text)
    assert code not in {f.code for f in fixed.result.findings}
    assert fixed.fixed >= 1
    again = fix_text(fixed.text, unsafe=True)
    assert again.text == fixed.text and again.fixed == 0


FIXED_CODES = ["GL001", "GL002", "GL003", "GL004", "GL005", "GL101", "GL102", "GL103", "GL104"]


@pytest.mark.parametrize("code", FIXED_CODES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fix_of_generated_loop(code, data):
    _check(code, data.draw(variants(code), label="loop"))
