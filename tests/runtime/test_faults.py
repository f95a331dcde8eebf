"""``gradlint run`` under faults: one clear message, torch exactly as before, no stray processes."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
from click.testing import CliRunner

from gradlint.runtime.commands import run_command
from torch_state import torch_patch_points, train_everything

PRELUDE = """\
import sys
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""

FAULTS = {
    "raises_mid_step": (
        """\
        for i in range(10):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            if i == 2:
                raise RuntimeError("loader died mid-step")
            opt.step()
        """,
        "RuntimeError: loader died mid-step",
    ),
    "exits_mid_training": (
        """\
        for i in range(10):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            if i == 1:
                sys.exit(4)
        """,
        "sys.exit(4)",
    ),
    "never_steps": (
        """\
        for i in range(3):
            model(torch.randn(2, 4)).sum().backward()
        """,
        "never stepped",
    ),
}


def _children() -> set[int]:
    """Process ids whose parent is this process (read from /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found.add(int(entry))
    return found


@pytest.fixture()
def no_static(monkeypatch):
    from gradlint.runtime import run as run_module

    monkeypatch.setattr(run_module, "static_findings", lambda path: [])


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_one_clear_message_and_torch_is_restored(tmp_path, no_static, name):
    body, message = FAULTS[name]
    script = tmp_path / f"{name}.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    before_points = torch_patch_points()
    before_training = train_everything()

    result = CliRunner().invoke(run_command, [str(script), "--steps", "5"])

    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("gradlint run:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert torch_patch_points() == before_points
    for a, b in zip(before_training, train_everything()):
        assert torch.equal(a, b)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc for child processes")
def test_dataloader_workers_are_gone_after_the_run_is_stopped(tmp_path, no_static):
    script = tmp_path / "workers.py"
    script.write_text(
        PRELUDE
        + textwrap.dedent(
            """\
            from torch.utils.data import DataLoader, TensorDataset

            data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
            loader = DataLoader(data, batch_size=4, num_workers=2)
            for x, y in loader:
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            """
        )
    )
    before = _children()
    result = CliRunner().invoke(run_command, [str(script), "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert "3 optimizer steps (stopped)" in result.output
    assert _children() - before == set()
