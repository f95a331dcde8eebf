"""The CPU tensor meter agrees to the byte with PyTorch's MemTracker and with itself on fake tensors."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from gradlint.runtime.fake import fake_tensors
from gradlint.runtime.memory import CATEGORIES, TensorMemoryMeter


def _setup(kind):
    torch.manual_seed(0)
    if kind == "mlp-adamw":
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.Dropout(0.1), nn.ReLU(), nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    return model, opt, x, y


def _loop(model, opt, x, y, steps=3, before_step=lambda: None):
    for _ in range(steps):
        before_step()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("kind", ["mlp-adamw", "norm-dropout-sgd"])
def test_peak_agrees_to_the_byte_with_memtracker(kind):
    from torch.distributed._tools.mem_tracker import MemTracker

    model, opt, x, y = _setup(kind)
    tracker = MemTracker()
    tracker.track_external(model, opt, x, y)
    with tracker:
        _loop(model, opt, x, y, before_step=tracker.reset_mod_stats)
    expected = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    model, opt, x, y = _setup(kind)
    meter = TensorMemoryMeter()
    meter.track(model, opt, x, y)
    with meter:
        _loop(model, opt, x, y)
    report = meter.report()
    assert report.peak == expected
    assert sum(report.split.values()) == report.peak
    n_param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert report.split["parameters"] == n_param_bytes


def test_split_at_the_peak_is_what_the_optimizer_holds():
    model, opt, x, y = _setup("mlp-adamw")
    meter = TensorMemoryMeter()
    meter.track(model, opt, x, y)
    with meter:
        _loop(model, opt, x, y)
    split = meter.report().split
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert set(split) == set(CATEGORIES)
    assert split["gradients"] == param_bytes  # AdamW peaks inside step(): all gradients alive
    assert split["optimizer state"] == 2 * param_bytes + 4 * len(list(model.parameters()))  # exp_avg, exp_avg_sq, step
    assert split["temporaries"] > 0


def test_freed_tensors_are_subtracted():
    meter = TensorMemoryMeter()
    with meter:
        a = torch.ones(1000)
        b = a[10:20]  # a view: no new storage
        c = torch.ones(500)
        assert meter.current == 6000
        del a, b
        assert meter.current == 2000
        del c
    assert meter.current == 0 and meter.peak == 6000


@pytest.mark.parametrize("kind", ["mlp-adamw", "norm-dropout-sgd"])
def test_fake_tensors_reproduce_the_real_peak(kind):
    peaks = []
    for fake in (False, True):
        with fake_tensors() if fake else contextlib.nullcontext():
            meter = TensorMemoryMeter()
            with meter:
                model, opt, x, y = _setup(kind)
                _loop(model, opt, x, y)
        peaks.append(meter.report())
    real, fake = peaks
    assert fake.peak == real.peak
    assert fake.split == real.split


def _train_inside(meter_or_profiler):
    """Build and train a small MLP entirely inside the measuring context; return what stays alive."""
    with meter_or_profiler:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
        _loop(model, opt, x, y)
    return model, opt, x, y


def test_peak_and_live_bytes_agree_with_the_profilers_allocator_events():
    """An independent method: torch.profiler records every CPU allocation and free, below the dispatcher."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    _train_inside(prof)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)

    meter = TensorMemoryMeter()
    model, opt, x, y = _train_inside(meter)
    assert meter.current == live  # what is still alive at the end: exactly the same bytes
    # Kernels allocate a few scalars for their own use (AdamW's step arithmetic: 4 and 8 bytes) and
    # free them before returning; no tensor carries them, so the meter cannot see them. At most
    # those few bytes separate the two peaks.
    assert 0 <= peak - meter.peak <= 16


def test_live_bytes_match_a_manual_count_of_tensor_sizes():
    """A second independent method: add up the sizes of the tensors that must be alive after training."""
    meter = TensorMemoryMeter()
    model, opt, x, y = _train_inside(meter)
    params = list(model.parameters())
    expected = sum(t.numel() * t.element_size() for t in (*params, x, y))
    expected += sum(p.grad.numel() * p.grad.element_size() for p in params)  # zero_grad runs before backward
    for p in params:  # AdamW: exp_avg and exp_avg_sq like p, a 0-d float32 step counter
        state = opt.state[p]
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        expected += 2 * p.numel() * p.element_size() + state["step"].element_size()
    assert meter.current == expected


def _sgd_step_on(device: str, built_on: str) -> TensorMemoryMeter:
    meter = TensorMemoryMeter()
    with meter:
        model = nn.Sequential(nn.Linear(64, 256, device=built_on), nn.GELU(), nn.Linear(256, 10, device=built_on))
        model.to(device).to(torch.bfloat16)  # the shape of fixtures/run_device_scripts.py --kind sequential
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(8, 64, device=device, dtype=torch.bfloat16)).float().sum().backward()
            opt.step()
    return meter


def test_once_a_tensor_is_on_an_accelerator_only_that_device_is_counted(monkeypatch):
    """A model built on the CPU and moved holds both copies of a parameter for a moment; the device never does.

    ``meta`` stands in for the GPU here. On an H100 the meter that added the
    two devices reported 142,376 bytes for a bf16 model whose CUDA allocator
    peak was 123,392 (the move's moment, not the training step).
    """
    monkeypatch.setattr(TensorMemoryMeter, "HOST_DEVICES", ("cpu",))
    moved, born_there = _sgd_step_on("meta", built_on="cpu"), _sgd_step_on("meta", built_on="meta")
    assert moved.device == born_there.device == "meta"
    assert moved.report() == born_there.report()
    params = 2 * (64 * 256 + 256 + 256 * 10 + 10)
    assert moved.report().split["parameters"] == params  # the peak is the step's, with the parameters known
    assert moved.report().split["optimizer state"] == params
    # with meta counted as the host's, the moment of the move sets the peak: both float32 copies of the 64x256
    # weight, and the rest of the float32 model on one device or the other
    monkeypatch.setattr(TensorMemoryMeter, "HOST_DEVICES", ("cpu", "meta"))
    both = _sgd_step_on("meta", built_on="cpu")
    assert both.device is None and both.peak == 4 * (64 * 256 + 256 + 256 * 10 + 10) + 4 * 64 * 256 > moved.peak


def test_a_cuda_storage_counts_the_allocator_block_it_takes():
    """The CUDA caching allocator hands out 512-byte blocks; a fake CUDA tensor (no GPU needed) is counted as one.

    On an H200 the tensor bytes of a small bf16 model were 120,452 against an
    allocator peak of 123,392 net of cuBLAS's workspaces (2.4 % under).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    meter = TensorMemoryMeter()
    with FakeTensorMode(), meter:
        kept = [torch.empty(3, device="cuda"), torch.empty(200, device="cuda"), torch.empty(0, device="cuda")]
        assert meter.device == "cuda"
        assert meter.current == 512 + 1024 + 0  # 12 bytes take a block, 800 bytes two, an empty storage none
        kept.append(torch.empty(3, device="cpu"))  # another device's bytes are not this allocator's
        assert meter.current == 1536
    assert len(kept) == 4
