"""Every run of `measure` starts from the same baseline: a process of its own, nothing of an earlier run alive."""

from __future__ import annotations

import pytest
import torch
from child_functions import exit_hard, kill_self, post_and_return
from click.testing import CliRunner

from gradlint.runtime.commands import measure_command
from gradlint.runtime.isolation import ChildDied, call_in_child
from gradlint.runtime.measure import AS_WRITTEN, RELEASE, SET_TO_NONE, format_table, measure_mode, measure_script
from gradlint.runtime.memory import MeterAllocator, PhaseMeter, TensorMemoryMeter

MiB = 2**20

# A helper module that caches a 16 MiB tensor the first time it is asked, as a
# data set cache would: in one process, only the first run would allocate it.
HELPER = """\
import torch

CACHE = []


def table():
    if not CACHE:
        CACHE.append(torch.ones(4 * 2**20))
    return CACHE[0]
"""

SCRIPT = """\
import torch
from torch import nn

import cached_table

torch.manual_seed(0)
model = nn.Linear(64, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    x = torch.randn(4, 64) + cached_table.table()[:64]
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()
"""


@pytest.fixture
def leaky(tmp_path):
    (tmp_path / "cached_table.py").write_text(HELPER)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return str(script)


def test_a_cache_that_outlives_a_run_is_reported_and_not_folded_into_the_next_mode(leaky):
    results, refused = measure_script(leaky, steps=2, time_steps=0)
    by_mode = {r.mode: r for r in results}
    plain, cleared = by_mode[AS_WRITTEN], by_mode[SET_TO_NONE]
    # each mode allocates the cache anew: in one process the second mode would start with it and peak 16 MiB lower
    assert plain.memory.peak > 16 * MiB
    assert cleared.memory.peak == plain.memory.peak
    for r in results:  # the cache, still held by its module once the script's objects are gone, and nothing else
        assert r.survived == 16 * MiB, r.mode
    assert "outlived its run" in format_table(results) and "as written 16.00 MiB" in format_table(results)


def test_the_child_runs_with_the_current_environment_and_folder(tmp_path, monkeypatch):
    """The server that forks the children may be older than the parent's environment: each child gets the current one."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch\n"
        "assert os.environ['GRADLINT_TEST_VALUE'] == 'fresh' and os.getcwd() == os.environ['GRADLINT_TEST_CWD']\n"
        "m = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    o.zero_grad(); m(torch.ones(2)).sum().backward(); o.step()\n"
    )
    call_in_child(post_and_return, 1)  # the server that forks the children runs from now on
    monkeypatch.setenv("GRADLINT_TEST_VALUE", "fresh")
    monkeypatch.setenv("GRADLINT_TEST_CWD", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    result = measure_mode(str(script), AS_WRITTEN, steps=2, time_steps=0)
    assert result.steps == 2


def test_call_in_child_returns_posts_and_reports_a_death():
    seen = []
    assert call_in_child(post_and_return, 21, on_message=seen.append) == 42
    assert seen == [("step", 21)]
    with pytest.raises(ChildDied, match="exited with status 3 without a result"):
        call_in_child(exit_hard, 3)
    with pytest.raises(ChildDied, match="killed by SIGKILL .often the out-of-memory killer"):
        call_in_child(kill_self)


def test_measure_says_when_the_run_s_process_died(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, torch\nm = torch.nn.Linear(2, 1)\nos._exit(5)\n")
    result = CliRunner().invoke(measure_command, [str(script), "--time-steps", "3"])
    assert result.exit_code == 2
    assert "as written: the run's process exited with status 5 without a result" in result.output


def test_phase_peaks_are_reset_at_each_boundary_and_the_open_phase_gets_the_last_segment():
    """The allocator's phase bookkeeping, read from the tensor meter: a run stopped inside its step credits the step."""
    already = torch.ones(MiB // 4)  # alive before the phases are read: the baseline, left out of every figure
    meter = TensorMemoryMeter()
    meter.track(already)
    phases = PhaseMeter(MeterAllocator(meter))
    with phases, meter:
        activations = torch.ones(MiB // 4)  # forward: 1 MiB
        phases.begin("backward")
        scratch = torch.ones(MiB // 2)  # 2 MiB on top, freed before the backward ends
        del scratch
        grads = torch.ones(MiB // 8)  # 0.5 MiB
        phases.end("backward")
        phases.begin("step")
        temporaries = torch.ones(3 * MiB // 4)  # 3 MiB; the run stops here, the step never ends
    assert phases.baseline == MiB
    # "forward" is every segment outside backward, step and clear: here also the moment between backward and step
    assert phases.phases["forward"]["peak"] == MiB + MiB // 2
    assert phases.phases["backward"]["peak"] == 3 * MiB
    assert phases.phases["step"]["peak"] == MiB + MiB // 2 + 3 * MiB  # not credited to the forward
    assert phases.peak == meter.peak - MiB == phases.phases["step"]["peak"]
    del activations, grads, temporaries, already
