"""`measure --fake` against real runs: model kinds, and the lines every large-model script has (.to, .cuda, bf16)."""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from gradlint.runtime.fake import CPU, CUDA, STORIES, device_story, fake_tensors
from gradlint.runtime.kernels import FOREACH, kernel_of
from gradlint.runtime.measure import AS_WRITTEN, format_table, measure_mode
from gradlint.runtime.memory import UNSIZED_BY_FAKE

KINDS = ["mlp", "conv", "lstm", "attention", "embedding-ce"]


def _pair(fixtures_dir, args):
    script = os.path.join(fixtures_dir, "run_model_kinds.py")
    real = measure_mode(script, AS_WRITTEN, args, steps=2, time_steps=0)
    fake = measure_mode(script, AS_WRITTEN, args, steps=2, fake=True)
    return real, fake


@pytest.mark.parametrize("kind", KINDS)
def test_fake_agrees_with_real_within_2_percent_or_names_what_it_cannot_size(fixtures_dir, kind):
    real, fake = _pair(fixtures_dir, ["--kind", kind])
    error = fake.memory.peak / real.memory.peak - 1
    if fake.unsized_ops:
        assert set(fake.unsized_ops) <= set(UNSIZED_BY_FAKE)
        assert error < -0.02  # named because it matters: the estimate really is low
        assert "the fake estimate is LOW" in format_table([fake], fake=True)
    else:
        assert abs(error) <= 0.02, (kind, real.memory.peak, fake.memory.peak)
        assert "the fake estimate is LOW" not in format_table([fake], fake=True)


def test_lstm_names_the_onednn_workspace(fixtures_dir):
    _, fake = _pair(fixtures_dir, ["--kind", "lstm"])
    assert set(fake.unsized_ops) == {"aten.mkldnn_rnn_layer"}


# With a GPU visible, fake CUDA tensors take the GPU story: their bytes are the GPU's (its foreach kernels), not the
# CPU twin's; tests/runtime/test_cuda.py compares them with the allocator there, and gpu_check.sh runs this file again
# with the GPU hidden.
NO_GPU_VISIBLE = pytest.mark.skipif(torch.cuda.is_available(), reason="a visible GPU gives fake CUDA tensors the GPU story")
CUDA_LINES = [["--device", "cuda"], ["--device", "cuda", "--bf16"]]


@pytest.mark.parametrize("extra", [["--bf16"], *(pytest.param(e, marks=NO_GPU_VISIBLE) for e in CUDA_LINES)])
def test_device_moves_and_dtype_casts_run_on_fake_tensors(fixtures_dir, extra):
    """A CPU-only machine: the CUDA lines run only on fake tensors; their bytes are the CPU run's bytes."""
    script = os.path.join(fixtures_dir, "run_model_kinds.py")
    fake = measure_mode(script, AS_WRITTEN, ["--kind", "mlp", *extra], steps=2, fake=True)
    real = measure_mode(script, AS_WRITTEN, ["--kind", "mlp", *[a for a in extra if a == "--bf16"]], steps=2, time_steps=0)
    assert fake.steps == 2 and fake.memory.peak == real.memory.peak
    if "--bf16" in extra:  # half the parameter bytes of the float32 model
        assert fake.memory.split["parameters"] == 2 * (128 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)


# ---------------------------------------------------------------------- one device story per run
# The GPU story as far as a build without a GPU can run it: module moves on a CPU build (which never asks the
# device); a CUDA build without a GPU initialises the device for every fake CUDA tensor, and never takes this story.
GPU_STORY_RUNS_HERE = pytest.mark.skipif(
    torch.backends.cuda.is_built() and not torch.cuda.is_available(),
    reason="a CUDA build without a GPU takes the CPU story; fake CUDA tensors would initialise a device it lacks",
)
DEVICE_KINDS = ["tutorial", "gpt", "sequential"]


@NO_GPU_VISIBLE
@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_cuda_scripts_measure_on_fake_tensors_as_their_cpu_twin(fixtures_dir, kind):
    """No GPU is visible here: every fake tensor is a CPU tensor, the CUDA script's bytes are the CPU script's."""
    script = os.path.join(fixtures_dir, "run_device_scripts.py")
    fake = measure_mode(script, AS_WRITTEN, ["--kind", kind, "--device", "cuda"], steps=2, fake=True)
    real = measure_mode(script, AS_WRITTEN, ["--kind", kind, "--device", "cpu"], steps=2, time_steps=0)
    assert fake.steps == real.steps == 2
    assert fake.memory.peak == real.memory.peak and fake.memory.split == real.memory.split
    assert fake.device_story == STORIES[CPU]
    assert "fake tensors: CUDA devices mapped to the CPU (no GPU visible)" in format_table([fake], fake=True)


@pytest.mark.parametrize("built", [False, True], ids=["cpu-build", "cuda-build"])
def test_without_a_visible_gpu_any_build_maps_every_cuda_tensor_to_the_cpu(monkeypatch, built):
    """The decision a CUDA build without a GPU takes is made on visibility alone, and runs here as it runs there."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: built)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_device(*args, **kwargs):
        raise RuntimeError("Found no NVIDIA driver on your system")  # a CUDA build without a GPU, asked of its device

    # torch 2.11's optimizer step asks this of CUDA once it is "available" (a GPU-less CUDA build crashed there)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", no_device)
    assert device_story() == CPU
    with fake_tensors():
        assert torch.cuda.is_available()  # what the script is told
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).cuda().to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters())
        x = torch.rand(2, 8).cuda().to(torch.bfloat16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        out.float().sum().backward()
        opt.step()
        assert torch.cuda.is_current_stream_capturing() is False
        tensors = [*model.parameters(), *(p.grad for p in model.parameters()), x, out]
        tensors += [v for state in opt.state.values() for v in state.values()]
        assert {t.device.type for t in tensors} == {"cpu"}
        assert all(isinstance(t, FakeTensor) for t in tensors)


@GPU_STORY_RUNS_HERE
def test_a_visible_gpu_keeps_every_parameter_on_the_fake_cuda_device_its_module_moved_to():
    """The story where a GPU is visible, as far as a CPU build can run it: module moves and the forward.

    A parameter converted through ``.data`` kept reporting the CPU while its
    inputs were on CUDA ("found two different devices cpu, cuda:0" in cat, mm
    and embedding). Autograd on fake CUDA tensors needs CUDA's runtime, so the
    backward and step of this story run on a GPU only (tests/runtime/test_cuda.py).
    """
    with fake_tensors(story=CUDA) as mode:
        assert mode.device_story == STORIES[CUDA]
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
        model.class_token = nn.Parameter(torch.zeros(1, 1, 8))
        model._apply(lambda t: torch.empty_like(t, device="cuda"))  # what .cuda() does, without CUDA's runtime
        model.to(torch.bfloat16)
        assert {(p.device.type, p.dtype) for p in model.parameters()} == {("cuda", torch.bfloat16)}
        with torch.no_grad():
            x = torch.randn(2, 3, 8, device="cuda", dtype=torch.bfloat16)
            tokens = torch.cat([model.class_token.expand(2, -1, -1), x], dim=1)
            out = model[0](tokens)
        assert tokens.device.type == out.device.type == "cuda"


def test_fake_tensors_are_offered_the_foreach_kernels_their_real_tensors_are_offered():
    """torch picks its foreach kernels by a tensor's exact type; a fake parameter's is ``FakeTensor``.

    Without the stand-in, a fake run on CUDA (foreach by default) stepped Adam
    with the per-parameter loop and left out the foreach temporaries: ViT-L's
    fake peak was 19.5 % under the allocator's on an H100.
    """
    from torch.optim.optimizer import _default_to_fused_or_foreach
    from torch.utils._foreach_utils import _has_foreach_support

    real_grads = [torch.ones(3)]
    with fake_tensors(story=CPU):
        model = nn.Linear(4, 4)
        model(torch.randn(2, 4)).sum().backward()
        grads = [p.grad for p in model.parameters()]
        assert all(isinstance(g, FakeTensor) for g in grads)
        assert _has_foreach_support(grads, torch.device("cpu")) == _has_foreach_support(real_grads, torch.device("cpu"))
        # the device decides from here on, as for real parameters: CPU takes the per-parameter loop by default
        assert _default_to_fused_or_foreach(list(model.parameters()), False, False) == (False, False)
    for name in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        assert FakeTensor not in importlib.import_module(name)._foreach_supported_types


@GPU_STORY_RUNS_HERE
def test_the_kernel_reported_for_fake_cuda_parameters_is_the_one_torch_picks_for_real_ones():
    """``measure`` names each optimizer's kernel after the run, outside the fake mode: foreach, as on CUDA."""
    with fake_tensors(story=CUDA):
        model = nn.Linear(4, 4)
        model._apply(lambda t: torch.empty_like(t, device="cuda"))  # what .cuda() does, without CUDA's runtime
        opt = torch.optim.Adam(model.parameters())
    assert kernel_of(opt) == FOREACH


def test_torch_optimi_release_is_labelled_with_the_kernel_optimi_runs():
    """optimi's release steps each parameter with its for-loop unless the group asks for Triton (triton=True)."""
    optimi = pytest.importorskip("optimi")
    from gradlint.runtime.kernels import FOR_LOOP, TRITON

    model = nn.Linear(8, 4)
    opt = optimi.AdamW(model.parameters(), lr=1e-3, gradient_release=True)
    assert kernel_of(opt) == FOR_LOOP  # not torch's foreach default for the same parameters
    opt.param_groups[0]["triton"] = True  # what triton=True sets, where Triton is installed
    assert kernel_of(opt) == TRITON
