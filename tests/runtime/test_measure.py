"""`gradlint measure`: three modes, exact fake estimates, plain verdicts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gradlint.runtime.commands import measure_command
from gradlint.runtime.measure import (
    AS_WRITTEN,
    FUSED,
    MODES,
    OPTIMI_REWRITE,
    REWRITE_RELEASE,
    RELEASE,
    SET_TO_NONE,
    _phase_spans,
    format_table,
    human_bytes,
    judge_difference,
    max_param_difference,
    measure_mode,
    measure_script,
    noise_floor_needed,
    ModeResult,
)


def plain_phases(result):
    return [p for p in result.phases if p[0] != "step" or result.mode != RELEASE]

TINY_LM = ["--blocks", "1", "--width", "32", "--heads", "2", "--hidden", "64", "--vocab", "64", "--seq", "8", "--batch", "2"]


def _by_mode(results):
    return {r.mode: r for r in results}


def test_three_modes_on_a_small_transformer_and_fake_reproduces_them_to_the_byte(fixtures_dir):
    script = os.path.join(fixtures_dir, "run_llm_shaped.py")
    real, refused = measure_script(script, TINY_LM, steps=3)
    fake, refused_fake = measure_script(script, TINY_LM, steps=3, fake=True)
    assert refused is None and refused_fake is None
    assert [r.mode for r in real] == list(MODES) == [r.mode for r in fake]
    for r, f in zip(real, fake):
        assert r.steps == f.steps == 3
        assert f.memory.peak == r.memory.peak, r.mode
        assert f.memory.split == r.memory.split, r.mode
        assert f.params is None
    base, by_mode = real[0], _by_mode(real)
    assert max_param_difference(base, by_mode[SET_TO_NONE]) == 0.0
    # release runs the GL204 rewrite (GradientRelease on the script's AdamW) through the fused kernel, as fused mode
    # does: against as written's foreach kernel rounding only, against fused mode bitwise
    assert by_mode[RELEASE].variant == REWRITE_RELEASE
    assert by_mode[RELEASE].release_kernels == ["AdamW: fused"] and by_mode[FUSED].kernels == ["AdamW: fused"]
    for mode in (RELEASE, FUSED):
        assert 0 < max_param_difference(base, by_mode[mode]) < 1e-6
    assert max_param_difference(by_mode[RELEASE], by_mode[FUSED]) == 0.0
    for r in real:
        assert len(r.step_times) == 10 and all(t > 0 for t in r.step_times)  # 12 timed steps, first interval dropped
        assert r.curve and max(b for _, b in r.curve) <= r.memory.peak
    # nothing of the script outlives its run, the release the script makes itself included
    assert [r.survived for r in real] == [0, 0, 0, 0]


def test_release_lowers_the_peak_of_a_parameter_heavy_loop(fixtures_dir):
    results, refused = measure_script(os.path.join(fixtures_dir, "run_wide_mlp.py"), steps=3, time_steps=0)
    modes = _by_mode(results)
    plain, release = modes[AS_WRITTEN].memory, modes[RELEASE].memory
    assert refused is None
    assert release.peak < plain.peak
    assert release.split["gradients"] < plain.split["gradients"]
    # at most the largest gradient (512 x 512 floats) is alive at release's peak
    assert release.split["gradients"] <= 512 * 512 * 4
    assert modes[SET_TO_NONE].memory.peak <= plain.peak
    assert modes[RELEASE].variant == REWRITE_RELEASE
    # the plotted step: its own clock in seconds, and its phases in order
    for r in results:
        names = [name for name, _, _ in sorted(r.phases, key=lambda p: p[1])]
        assert names[0] == "clear" and "backward" in names  # the GL204 rewrite keeps the loop's zero_grad()
        end = max(t for t, _ in r.curve)
        assert 0 < end < 60 and all(0 <= a <= b <= end + 1e-3 for _, a, b in r.phases)
    assert [n for n, _, _ in sorted(plain_phases(modes[AS_WRITTEN]), key=lambda p: p[1])][-1] == "step"
    spans = _phase_spans(modes[AS_WRITTEN])
    assert {name for name, _, _ in spans} == {"forward", "backward", "step", "clear"}
    assert all(a1 <= a2 for (_, a1, _), (_, a2, _) in zip(spans, spans[1:]))


def test_cli_prints_the_table_and_writes_the_plot(fixtures_dir, tmp_path):
    pytest.importorskip("matplotlib")  # the runtime extra's; a GPU machine with its own torch may lack it
    png = tmp_path / "mem.png"
    result = CliRunner().invoke(
        measure_command, [os.path.join(fixtures_dir, "run_llm_shaped.py"), "--steps", "2", "--plot", str(png), "--", *TINY_LM]
    )
    assert result.exit_code == 0, result.output
    assert "peak" in result.output and "gradient release" in result.output and "set_to_none=True" in result.output
    assert "does NOT lower the peak" in result.output or "lowers the peak by" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "name,args,reason",
    [
        ("run_clean_accumulation.py", ["4"], "gradient accumulation cannot be combined with gradient release"),
        ("run_clean_accumulation.py", ["1"], "gradient clipping cannot be combined with gradient release"),
        ("run_clean_scaler.py", [], "a GradScaler cannot be used with gradient release"),
    ],
)
def test_release_refusal_is_reported_not_fatal(fixtures_dir, name, args, reason):
    results, refused = measure_script(os.path.join(fixtures_dir, name), args, steps=2, time_steps=3)
    assert [r.mode for r in results] == [AS_WRITTEN, SET_TO_NONE, FUSED]  # SGD: fused=True is on offer
    assert refused.startswith(reason), refused


def test_cli_exit_2_on_a_failing_script(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch\nraise RuntimeError('no data')\n")
    result = CliRunner().invoke(measure_command, [str(script)])
    assert result.exit_code == 2
    assert "no data" in result.output


@pytest.mark.slow
def test_fake_7b_shaped_model_completes_with_a_plausible_size(fixtures_dir):
    args = ["--blocks", "32", "--width", "4096", "--heads", "32", "--vocab", "32000", "--seq", "256", "--batch", "1"]
    results, refused = measure_script(os.path.join(fixtures_dir, "run_llm_shaped.py"), args, steps=2, fake=True)
    assert refused is None
    plain = _by_mode(results)[AS_WRITTEN].memory
    n_params = plain.split["parameters"] / 4
    assert 6.5e9 < n_params < 7.0e9
    # fp32 AdamW: parameters + gradients + two moments is 16 bytes per parameter, before activations
    assert plain.peak >= 16 * n_params
    assert _by_mode(results)[RELEASE].memory.split["gradients"] < plain.split["gradients"]


CLIP_PRELUDE = """\
import torch
from torch import nn
{imports}

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(10):
    optimizer.zero_grad()
    nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
    {clip}
    optimizer.step()
"""

READS_GRADIENTS = {
    "early-bound clip_grad_norm_": ("from torch.nn.utils import clip_grad_norm_", "clip_grad_norm_(model.parameters(), 0.5)", "clipping"),
    "clip_grad module": ("from torch.nn.utils import clip_grad", "clip_grad.clip_grad_value_(model.parameters(), 0.1)", "clipping"),
    "get_total_norm for logging": (
        "from torch.nn.utils import get_total_norm",
        "print(float(get_total_norm([p.grad for p in model.parameters() if p.grad is not None])))",
        "clipping",
    ),
    "manual clipping": ("", "[p.grad.mul_(0.5) for p in model.parameters()]", "fails under gradient release"),
}


@pytest.mark.parametrize("name", sorted(READS_GRADIENTS))
def test_release_is_not_measured_when_the_loop_needs_gradients_after_backward(tmp_path, name):
    imports, clip, reason = READS_GRADIENTS[name]
    script = tmp_path / "train.py"
    script.write_text(CLIP_PRELUDE.format(imports=imports, clip=clip))
    results, refused = measure_script(str(script), steps=2, time_steps=0)
    assert [r.mode for r in results] == [AS_WRITTEN, SET_TO_NONE, FUSED]
    assert refused is not None and reason in refused


# ---------------------------------------------------------------------- what release promises is what --fix gives
WIDE_ADAMW = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(20):
    x, y = torch.randn(4, 512), torch.randint(0, 10, (4,))
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""


@pytest.mark.parametrize("rewrite", [REWRITE_RELEASE, OPTIMI_REWRITE])
def test_the_release_figure_is_the_figure_of_the_rewrite_fix_writes_and_fused_is_offered(tmp_path, rewrite):
    """An MLP 512-2048-2048-10 with AdamW at batch 4: release measured 108.35 MiB where optimi's rewrite gave 92.35.

    The rewrite is GradientRelease on the script's optimizer, or optimi's release in a module already using optimi.
    """
    text = WIDE_ADAMW
    if rewrite == OPTIMI_REWRITE:
        pytest.importorskip("optimi")
        text = "import optimi  # noqa: F401\n" + WIDE_ADAMW
    script = tmp_path / "train.py"
    script.write_text(text)
    results, refused = measure_script(str(script), steps=3, time_steps=0)
    by_mode = _by_mode(results)
    assert refused is None and by_mode[RELEASE].variant == rewrite
    fixed = tmp_path / "fixed.py"
    fixed.write_text(text)
    subprocess.run([sys.executable, "-m", "gradlint", "check", "--no-cache", "--select", "GL204", "--unsafe-fixes", "--fix",
                    str(fixed)], capture_output=True, check=False, cwd=tmp_path)
    assert ("GradientRelease(optimizer)" if rewrite == REWRITE_RELEASE else "gradient_release=True") in fixed.read_text()
    rewritten = measure_mode(str(fixed), AS_WRITTEN, steps=3, time_steps=0)
    assert by_mode[RELEASE].memory == rewritten.memory  # peak and split, to the byte
    # P parameter bytes, the largest one w = 16 MiB: as written P + P (gradients) + 2P (AdamW's moments) + 2w
    # (the per-tensor kernel's temporaries). Either rewrite keeps one gradient alive at a time; optimi's kernel makes
    # one temporary besides (P + w + 2P + w), the fused kernel of GradientRelease none (P + w + 2P)
    P = (512 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10) * 4
    w = 2048 * 2048 * 4
    steps_and_small = 6 * 4  # AdamW's step counters, one float per tensor
    assert by_mode[AS_WRITTEN].memory.split["temporaries"] >= 2 * w
    near = 128 * 1024  # activations and small tensors
    assert abs(by_mode[AS_WRITTEN].memory.peak - (4 * P + 2 * w + steps_and_small)) < near
    temporaries = w if rewrite == OPTIMI_REWRITE else 0
    # (GradientRelease's first backward steps each parameter alone, and its buckets hold the small gradients of a
    # layer together: up to 256 KiB besides, as in the test of its own release below)
    assert abs(rewritten.memory.peak - (3 * P + w + temporaries + steps_and_small)) < 2 * near
    # fused=True: no temporaries the size of a parameter, one argument to the constructor
    fused = by_mode[FUSED].memory
    assert fused.split["temporaries"] < w // 2
    assert (fused.peak < rewritten.memory.peak) is (rewrite == OPTIMI_REWRITE)
    table = format_table(results)
    name = "GradientRelease" if rewrite == REWRITE_RELEASE else "torch-optimi"
    assert f"gradient release measured on the script's GL204 rewrite ({name})" in table
    assert f"gradient release lowers the peak by {human_bytes(by_mode[AS_WRITTEN].memory.peak - rewritten.memory.peak)}" in table
    assert "fused=True on AdamW lowers the peak by" in table


def test_gradlint_s_own_release_steps_through_the_fused_kernel_and_is_leaner_than_the_rewrite(tmp_path):
    """Where no rewrite applies, the release row is gradlint's own: fused kernel, bitwise equal to fused=True as written.

    Its peak is P + 2P (AdamW's moments) + w, the largest gradient while backward computes it: no temporaries.
    """
    script = tmp_path / "train.py"
    script.write_text(WIDE_ADAMW)
    own = measure_mode(str(script), RELEASE, steps=3, time_steps=0)
    fused = measure_mode(str(script), FUSED, steps=3, time_steps=0)
    assert own.release_kernels == ["AdamW: fused"]
    assert max_param_difference(own, fused) == 0.0
    P = (512 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10) * 4
    w = 2048 * 2048 * 4
    assert own.memory.split["gradients"] + own.memory.split["temporaries"] <= w + 2**20  # one large gradient at a time
    assert abs(own.memory.peak - (3 * P + w)) < 256 * 1024
    assert own.memory.peak < fused.memory.peak  # fused keeps all of P as gradients: P + 2P + P


# ---------------------------------------------------------------------- run-to-run noise
def test_a_difference_is_judged_against_the_run_to_run_noise_in_words():
    assert judge_difference(0.0, None) == "bitwise equal"
    assert judge_difference(2.5e-7, None) == "2.5e-07"
    assert judge_difference(1e-3, 2e-3) == "0.001: within run-to-run noise (0.002)"
    assert judge_difference(1.36e-3, 1e-3) == (
        "0.00136: of the order of run-to-run noise (1.4x the 0.001 between two as-written runs)")
    assert judge_difference(1e-2, 1e-3) == "0.01: beyond run-to-run noise (10x the 0.001 between two as-written runs)"
    assert judge_difference(1e-6, 0.0) == "1e-06: beyond run-to-run noise (two as-written runs were bitwise equal)"


@pytest.mark.parametrize("devices,deterministic,needed", [
    (["cuda"], False, True), (["cuda"], True, False), (["cpu"], False, False), (["cpu", "cuda"], False, True),
])
def test_as_written_runs_twice_only_where_two_runs_can_differ(devices, deterministic, needed):
    base = ModeResult(
        AS_WRITTEN, 2, None, [], [], [], None, param_devices=devices, deterministic=deterministic)
    assert noise_floor_needed(base) is needed


NOISY = """\
import os
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(16, 4)
with torch.no_grad():  # a nondeterministic kernel, played by the process id: every run differs a little
    model.weight.add_(1e-3 * (os.getpid() % 89 + 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    optimizer.zero_grad()
    model(torch.randn(8, 16)).square().mean().backward()
    optimizer.step()
"""


def test_measure_reruns_as_written_and_states_the_noise_the_differences_are_judged_against(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NOISY)
    results, _ = measure_script(str(script), steps=2, time_steps=4, noise=True)
    base = results[0]
    assert base.noise is not None and base.noise > 0
    table = format_table(results)
    # the second run is timed too, and the spread of the two step times is stated beside the table
    assert base.step_time_again is not None and base.step_time_again > 0
    spread = abs(base.median_step_time - base.step_time_again) / min(base.median_step_time, base.step_time_again)
    assert (f"step time of as written, run twice: {base.median_step_time * 1000:.1f} and "
            f"{base.step_time_again * 1000:.1f} ms ({spread:.0%} apart)") in table
    assert f"max |Δparam| against as written, whose run-to-run noise is {base.noise:.3g} (as written run twice)" in table
    assert "set_to_none=True bitwise equal" not in table  # another process, another "kernel"


def test_a_deterministic_loop_rerun_gives_zero_noise_and_bitwise_equal_modes(fixtures_dir):
    results, _ = measure_script(os.path.join(fixtures_dir, "run_wide_mlp.py"), steps=2, time_steps=0, noise=True)
    assert results[0].noise == 0.0
    assert "whose run-to-run noise is 0 (as written run twice): set_to_none=True bitwise equal" in format_table(results)
