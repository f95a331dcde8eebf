"""The CUDA path: allocator figures per phase and the memory snapshot. Skipped without a GPU (never run by this project's CI)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from gradlint.runtime.measure import AS_WRITTEN, RELEASE, measure_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SCRIPT = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
for step in range(20):
    x, y = torch.randn(4, 256, device="cuda"), torch.randint(0, 10, (4,), device="cuda")
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""


def test_allocator_phases_agree_with_the_tensor_meter(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    results, refused = measure_script(str(script), steps=3, time_steps=4, snapshot_prefix=str(tmp_path / "mem"))
    assert refused is None
    by_mode = {r.mode: r for r in results}
    for r in results:
        assert set(r.cuda_phases) == {"forward", "backward", "step", "clear"}
        assert r.allocator_peak == max(p["peak"] for p in r.cuda_phases.values())
        # the allocator rounds blocks up (512 bytes at least): never below the exact tensor count
        assert r.allocator_peak >= r.memory.peak
        assert r.allocator_peak <= r.memory.peak * 1.05 + 2**20
        for stats in r.cuda_phases.values():
            assert stats["reserved"] >= stats["allocated"]
    assert by_mode[RELEASE].allocator_peak < by_mode[AS_WRITTEN].allocator_peak
    snapshot = tmp_path / "mem.as-written.pickle"
    assert snapshot.exists()
    with open(snapshot, "rb") as handle:
        assert "segments" in pickle.load(handle)
    assert os.path.exists(tmp_path / "mem.gradient-release.pickle")
