"""`measure --fake` against real runs: model kinds, and the lines every large-model script has (.to, .cuda, bf16)."""

from __future__ import annotations

import os

import pytest

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


@pytest.mark.parametrize("extra", [["--bf16"], ["--device", "cuda"], ["--device", "cuda", "--bf16"]])
def test_device_moves_and_dtype_casts_run_on_fake_tensors(fixtures_dir, extra):
    """A CPU-only machine: the CUDA lines run only on fake tensors; their bytes are the CPU run's bytes."""
    script = os.path.join(fixtures_dir, "run_model_kinds.py")
    fake = measure_mode(script, AS_WRITTEN, ["--kind", "mlp", *extra], steps=2, fake=True)
    real = measure_mode(script, AS_WRITTEN, ["--kind", "mlp", *[a for a in extra if a == "--bf16"]], steps=2, time_steps=0)
    assert fake.steps == 2 and fake.memory.peak == real.memory.peak
    if "--bf16" in extra:  # half the parameter bytes of the float32 model
        assert fake.memory.split["parameters"] == 2 * (128 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)
