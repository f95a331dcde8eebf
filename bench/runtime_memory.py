"""The runtime's figures, each next to an independent check, in one run.

    python bench/runtime_memory.py [--batches 1 32] [--time-steps 12] [--only memory tracer fake release gpu]

1. Memory of a transformer-like stack (4 pre-norm blocks, width 256, vocab
   4096, seq 64, fp32 AdamW) as written, with set_to_none=True and with
   gradient release, at each batch size: the measured peak (CPU tensor meter),
   an analytic prediction from the parameter shapes and one forward-only
   measurement, the largest parameter difference from the as-written run
   (0 = bitwise equal) and the step time against the as-written run (timed in
   a separate run without the meter).
2. The tracer's own overhead (what `gradlint run` adds) on a small MLP, and
   whether training is bitwise identical with and without it.
3. `--fake` against real runs, per model kind.
4. Gradient release speed on the CPU: gradlint's release (fused kernel, in
   buckets) against the loop as written (default kernel and fused=True) and
   the per-parameter recipes of other tools (torch-optimi's gradient_release,
   PyTorch's tutorial recipe with the default and the fused kernel), all in
   one process, in rotated rounds; with each one's peak and its largest
   parameter difference from fused=True as written.
5. On a GPU only (skipped without CUDA): the PyTorch optimizer-in-backward
   tutorial loop (ViT-L/16 from torchvision, Adam, batch 1) and a GPT-2 from
   transformers (bf16 autocast, AdamW), each through `measure` (every mode:
   tensor peak, CUDA allocator peak net of cuBLAS workspaces, step-time
   ratios), `measure --fake` against the allocator, and section 4's recipes.

The analytic model (P parameter bytes, G = P gradients, S = 2P + 4 bytes per
tensor of AdamW state, T = 2 x the largest parameter for AdamW's per-tensor
temporaries, g = the largest gradient, A = activations alive at the end of the
forward, L = the logits, R = what the script still holds after backward: the
logits and the token batch) takes the larger of the two moments that can set
the peak:

    inside optimizer.step()        plain: P + G + S + T + R    release: P + g + S + T + R
    at the start of backward       P + S + A + 2L (the logits' gradient and cross-entropy's softmax)
    release only: the output layer (h bytes) is stepped first, inside backward, while the
    activations other than the logits are still alive:   P + S + h + T + (A - L)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")
SCRIPT = os.path.join(FIXTURES, "run_llm_shaped.py")
sys.path.insert(0, FIXTURES)

from run_llm_shaped import LanguageModel  # noqa: E402

from gradlint.runtime.measure import (  # noqa: E402
    AS_WRITTEN,
    RELEASE,
    format_table,
    human_bytes,
    max_param_difference,
    measure_mode,
    measure_script,
)
from gradlint.runtime.memory import TensorMemoryMeter  # noqa: E402
from gradlint.runtime.tracer import Tracer  # noqa: E402


def hidden_of(width: int) -> int:
    return -(-8 * width // 3 // 256) * 256


def analytic(args: argparse.Namespace, batch: int) -> dict[str, int]:
    """The model's terms, in bytes (fp32)."""
    hidden = hidden_of(args.width)
    with torch.device("meta"):
        model = LanguageModel(args.vocab, args.width, args.blocks, hidden, args.heads)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    P, largest = sum(sizes), max(sizes)
    torch.manual_seed(0)
    meter = TensorMemoryMeter()
    with meter:
        real = LanguageModel(args.vocab, args.width, args.blocks, hidden, args.heads)
        tokens = torch.randint(0, args.vocab, (batch, args.seq + 1))
        before = meter.current
        logits = real(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        activations = meter.current - before
        del loss, logits
    L = batch * args.seq * args.vocab * 4
    R = L + batch * (args.seq + 1) * 8
    head = model.head.weight.numel() * 4
    terms = {"P": P, "G": P, "S": 2 * P + 4 * len(sizes), "T": 2 * largest, "g": largest, "A": activations, "L": L, "R": R}
    backward_start = terms["P"] + terms["S"] + terms["A"] + 2 * L
    terms[AS_WRITTEN] = max(P + terms["G"] + terms["S"] + terms["T"] + R, backward_start)
    output_layer_step = P + terms["S"] + head + terms["T"] + activations - L
    terms[RELEASE] = max(P + largest + terms["S"] + terms["T"] + R, backward_start, output_layer_step)
    return terms


def memory_section(args: argparse.Namespace) -> None:
    print(f"1. transformer-like stack: {args.blocks} blocks, width {args.width}, MLP {hidden_of(args.width)}, "
          f"vocab {args.vocab}, seq {args.seq}, AdamW fp32; {args.steps} metered steps, {args.time_steps} timed steps per mode")
    for batch in args.batches:
        terms = analytic(args, batch)
        script_args = [f"--{k}={getattr(args, k)}" for k in ("blocks", "width", "heads", "vocab", "seq")]
        results, refused = measure_script(SCRIPT, [*script_args, f"--batch={batch}"], args.steps, time_steps=args.time_steps)
        print(f"\n   batch {batch}: P={human_bytes(terms['P'])}  A={human_bytes(terms['A'])}  "
              f"largest gradient={human_bytes(terms['g'])}  logits={human_bytes(terms['L'])}")
        print(f"   {'mode':<18} {'measured peak':>14} {'predicted':>11} {'measured/pred.':>15} {'max |dparam|':>13} "
              f"{'step time':>10} {'time ratio':>11}")
        base = results[0]
        for r in results:
            pred = terms.get(r.mode, terms[AS_WRITTEN])
            t = r.median_step_time or float("nan")
            print(f"   {r.mode:<18} {human_bytes(r.memory.peak):>14} {human_bytes(pred):>11} {r.memory.peak / pred:>15.3f} "
                  f"{max_param_difference(base, r):>13.3g} {t * 1000:>8.1f}ms {t / base.median_step_time:>11.2f}")
        peaks = {r.mode: r.memory.peak for r in results}
        if refused:
            print(f"   gradient release refused: {refused}")
        else:
            saving = peaks[AS_WRITTEN] - peaks[RELEASE]
            print(f"   release vs as written: {saving / peaks[AS_WRITTEN]:+.1%} of the peak saved ({human_bytes(saving)})")


def _mlp(depth: int, width: int) -> nn.Sequential:
    """``depth`` linear layers (2 parameter tensors each) from 64 inputs to 10 classes."""
    sizes = [64] + [width] * (depth - 1) + [10]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _mlp_loop(steps: int, depth: int = 3, width: int = 256, sgd: bool = False) -> tuple[float, list[torch.Tensor]]:
    """Median seconds per training step (the first 10 intervals left out) and the final parameters."""
    torch.manual_seed(0)
    model = _mlp(depth, width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3) if sgd else torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    times = []
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter())
    intervals = [b - a for a, b in zip(times[10:], times[11:])]
    return statistics.median(intervals), [p.detach().clone() for p in model.parameters()]


def _paired(
    steps: int, repeats: int, depth: int = 3, width: int = 256, sgd: bool = False
) -> tuple[list[float], list[float], bool]:
    """Plain and traced runs in adjacent pairs, alternating which goes first (ABBA), after one untimed pair.

    Adjacent runs see the same load on a shared machine; alternating the order
    cancels what the first run of a pair leaves to the second (allocator, caches).
    """
    def run(traced: bool, n: int) -> tuple[float, list[torch.Tensor]]:
        if not traced:
            return _mlp_loop(n, depth, width, sgd)
        with Tracer():
            return _mlp_loop(n, depth, width, sgd)

    run(False, 50), run(True, 50)
    plain_times, traced_times, equal = [], [], True
    for i in range(repeats):
        order = (False, True) if i % 2 == 0 else (True, False)
        result = {traced: run(traced, steps) for traced in order}
        (t_plain, p_plain), (t_traced, p_traced) = result[False], result[True]
        plain_times.append(t_plain)
        traced_times.append(t_traced)
        equal = equal and all(torch.equal(a, b) for a, b in zip(p_plain, p_traced))
    return plain_times, traced_times, equal


def tracer_section(repeats: int = 9, steps: int = 500) -> None:
    # One intra-op thread: with two on the shared 2-core machine, every pause
    # between kernels (the tracer's Python) lets the other OpenMP thread sleep,
    # and waking it under load costs whatever the scheduler makes it cost (the
    # ratio swung from 1.1x to 7x between runs at load 8).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _tracer_section(repeats, steps)
    finally:
        torch.set_num_threads(threads)


def _tracer_section(repeats: int, steps: int) -> None:
    print(f"\n2. tracer overhead: MLP 64-256-256-10, batch 32, AdamW, {steps} steps per run, median step, "
          f"{repeats} plain/traced pairs (ABBA order), 1 thread, load average {os.getloadavg()[0]:.1f}")
    plain_times, traced_times, equal = _paired(steps, repeats)
    ratios = sorted(t / p for p, t in zip(plain_times, traced_times))
    plain, traced = statistics.median(plain_times), statistics.median(traced_times)
    print(f"   plain {plain * 1000:.3f} ms, traced {traced * 1000:.3f} ms: ratio of medians {traced / plain:.3f}, "
          f"median of paired ratios {statistics.median(ratios):.3f} (pairs {ratios[0]:.3f}-{ratios[-1]:.3f}; "
          f"target <= 1.10); parameters bitwise equal with and without the tracer: {equal}; "
          f"load average after {os.getloadavg()[0]:.1f}")
    print("   overhead against the number of parameter tensors (MLP of width 16, SGD, 300 steps, 7 pairs):")
    for depth in (3, 12, 48):
        plain_times, traced_times, equal = _paired(300, 7, depth, 16, sgd=True)
        plain, traced = statistics.median(plain_times), statistics.median(traced_times)
        print(f"   {2 * depth:>3} tensors: plain {plain * 1e6:7.1f} us, traced {traced * 1e6:7.1f} us, "
              f"+{(traced - plain) * 1e6:5.1f} us per step (ratio {traced / plain:.3f}), bitwise equal: {equal}")


def fake_section() -> None:
    print("\n3. --fake against real runs (fixtures/run_model_kinds.py, AdamW, batch 8): as-written peak")
    script = os.path.join(FIXTURES, "run_model_kinds.py")
    for kind in ("mlp", "conv", "lstm", "attention", "embedding-ce"):
        real = measure_mode(script, AS_WRITTEN, ["--kind", kind], steps=2, time_steps=0)
        fake = measure_mode(script, AS_WRITTEN, ["--kind", kind], steps=2, fake=True)
        named = ", ".join(op.removeprefix("aten.") for op in fake.unsized_ops) or "-"
        print(f"   {kind:<13} real {human_bytes(real.memory.peak):>10}  fake {human_bytes(fake.memory.peak):>10}  "
              f"{fake.memory.peak / real.memory.peak - 1:+7.2%}  named as not sized by fake: {named}")


# ---------------------------------------------------------------------- 4. gradient release speed
REFERENCE = "as written, fused=True"
OURS = "gradlint GradientRelease (fused, buckets)"


def _recipes(device: str) -> dict[str, Callable]:
    """Each recipe: ``set_up(model, make) -> step(loss_of)``, one training step per call of ``step``.

    ``make(params, **options)`` builds the bench's optimizer class. The peers
    are the recipes of the table that started this work: torch-optimi's
    gradient_release, and PyTorch's tutorial recipe (one optimizer per
    parameter, stepped and cleared from its post-accumulate-grad hook) with
    the default and the fused kernel.
    """
    from gradlint.runtime.release import GradientRelease

    def plain(**options: Any) -> Callable:
        def set_up(model: nn.Module, make: Callable) -> Callable:
            opt = make(list(model.parameters()), **options)

            def step(loss_of: Callable) -> None:
                opt.zero_grad()
                loss_of(model).backward()
                opt.step()

            return step
        return set_up

    def released(**options: Any) -> Callable:
        def set_up(model: nn.Module, make: Callable) -> Callable:
            opt = make(list(model.parameters()))
            GradientRelease(opt, **options)

            def step(loss_of: Callable) -> None:
                loss_of(model).backward()
                opt.step()

            return step
        return set_up

    def per_parameter(**options: Any) -> Callable:
        def set_up(model: nn.Module, make: Callable) -> Callable:
            optimizers = {p: make([p], **options) for p in model.parameters()}

            def hook(p: torch.Tensor) -> None:
                optimizers[p].step()
                optimizers[p].zero_grad()

            for p in model.parameters():
                p.register_post_accumulate_grad_hook(hook)

            def step(loss_of: Callable) -> None:
                loss_of(model).backward()

            return step
        return set_up

    def optimi_release(**options: Any) -> Callable:
        def set_up(model: nn.Module, make: Callable) -> Callable:
            import optimi

            opt = getattr(optimi, make.name)(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                             gradient_release=True, **options)
            optimi.prepare_for_gradient_release(model, opt)

            def step(loss_of: Callable) -> None:
                loss_of(model).backward()
                opt.step()
                opt.zero_grad()

            return step
        return set_up

    recipes = {
        "as written (default kernel)": plain(),
        REFERENCE: plain(fused=True),
        OURS: released(),
        "gradlint GradientRelease, one bucket per parameter": released(bucket_bytes=1),
        "per-parameter hooks, default kernel": per_parameter(),
        "per-parameter hooks, fused=True": per_parameter(fused=True),
    }
    if importlib.util.find_spec("optimi") is not None:
        # optimi leaves triton=None (its for-loop) in gradient release unless asked: its own default to Triton is
        # taken only by a whole-model step (optimi/adam.py, _init_group), which release never calls
        recipes["torch-optimi gradient_release=True"] = optimi_release()
        from optimi.utils import HAS_TRITON

        if HAS_TRITON and device == "cuda":
            recipes["torch-optimi gradient_release=True, triton=True"] = optimi_release(triton=True)
    return recipes


def _maker(name: str) -> Callable:
    cls = getattr(torch.optim, name)

    def make(params: Any, **options: Any) -> torch.optim.Optimizer:
        return cls(params, lr=1e-3, **options)

    make.name = name  # type: ignore[attr-defined]
    return make


def compare_release(build: Callable[[], nn.Module], loss_of: Callable, optimizer: str, device: str,
                    steps: int, rounds: int) -> list[tuple[str, float, int, float]]:
    """``(recipe, median step seconds, peak bytes, max |dparam| against fused=True as written)`` for every recipe.

    All in this process: recipes run in rounds, each round in a rotated order,
    so every recipe sees the same load; a recipe's time is the median over
    rounds of its median step (the first two intervals of a run left out).
    The peak is that of a separate short run: the tensor meter's on the CPU,
    the allocator's on CUDA.
    """
    make = _maker(optimizer)
    recipes = _recipes(device)
    names = list(recipes)
    medians: dict[str, list[float]] = {name: [] for name in names}
    finals: dict[str, list[torch.Tensor]] = {}

    def run(name: str, n: int, keep: bool = True) -> list[float]:
        torch.manual_seed(0)
        model = build()
        step = recipes[name](model, make)
        torch.manual_seed(1)
        times = []
        for _ in range(n):
            step(loss_of)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter())
        if keep:
            finals[name] = [p.detach().to("cpu", copy=True) for p in model.parameters()]
        return [b - a for a, b in zip(times, times[1:])][2:]

    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            medians[name].append(statistics.median(run(name, steps)))
    peaks = {name: _peak_of(lambda name=name: run(name, 3, keep=False), device) for name in names}
    out = []
    for name in names:
        diff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(finals[name], finals[REFERENCE]))
        out.append((name, statistics.median(medians[name]), peaks[name], diff))
    return out


def _peak_of(run: Callable[[], Any], device: str) -> int:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        return torch.cuda.max_memory_allocated() - base
    meter = TensorMemoryMeter()
    with meter:
        run()
    return meter.peak


def print_release_table(rows: list[tuple[str, float, int, float]]) -> None:
    times = {name: t for name, t, _, _ in rows}
    base = times["as written (default kernel)"]
    print(f"   {'recipe':<52} {'step':>10} {'/ as written':>12} {'peak':>11} {'max |dparam| vs fused=True':>27}")
    for name, t, peak, diff in rows:
        print(f"   {name:<52} {t * 1000:>8.2f}ms {t / base:>11.2f}x {human_bytes(peak):>11} {diff:>27.3g}")
    peers = [t for name, t in times.items() if name.startswith(("per-parameter", "torch-optimi"))]
    print(f"   gradlint release: {times[OURS] / base:.2f}x as written (goal on a GPU: <= 1.20), "
          f"{times[OURS] / min(peers):.2f}x the fastest per-parameter peer (goal: <= 1.00)")


def _lm_task(vocab: int, width: int, blocks: int, heads: int, seq: int, batch: int, device: str) -> tuple:
    def build() -> nn.Module:
        return LanguageModel(vocab, width, blocks, hidden_of(width), heads).to(device)

    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(2)).to(device)

    def loss_of(model: nn.Module) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    return build, loss_of


def release_section(args: argparse.Namespace, steps: int = 30, rounds: int = 5) -> None:
    print(f"\n4. gradient release speed, CPU: the stack of section 1 ({args.blocks} blocks, width {args.width}, vocab "
          f"{args.vocab}, seq {args.seq}) at batch 1, AdamW; {steps} steps per run, {rounds} rounds in rotated order, "
          f"1 thread, load average {os.getloadavg()[0]:.1f}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        build, loss_of = _lm_task(args.vocab, args.width, args.blocks, args.heads, args.seq, 1, "cpu")
        print_release_table(compare_release(build, loss_of, "AdamW", "cpu", steps, rounds))
    finally:
        torch.set_num_threads(threads)
    print(f"   load average after {os.getloadavg()[0]:.1f}")


# ---------------------------------------------------------------------- 5. on a GPU
VIT_TUTORIAL = """\
import torch
import torchvision

model = torchvision.models.vit_l_16(weights=None).cuda()
optimizer = torch.optim.Adam(model.parameters())
for step in range(100):
    fake_image = torch.rand(1, 3, 224, 224).cuda()
    loss = model.forward(fake_image)
    loss.sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""

GPT2_BF16 = """\
import torch
import transformers

device = "cuda"
model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(100):
    ids = torch.randint(0, 50257, (4, 257), device=device)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
    optimizer.step()
"""


def _gpu_models() -> dict[str, tuple[str, str, Callable, Callable, str]]:
    """name -> (needed module, script, build, loss_of, optimizer) for the models whose library is installed."""
    models = {}
    if importlib.util.find_spec("torchvision") is not None:
        def build_vit() -> nn.Module:
            import torchvision

            with torch.device("cuda"):  # initialised on the GPU: seconds less per run than on the CPU
                return torchvision.models.vit_l_16(weights=None)

        image = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))

        def vit_loss(model: nn.Module) -> torch.Tensor:
            return model(image.cuda()).sum()

        models["ViT-L/16, Adam, batch 1 (the PyTorch tutorial)"] = ("torchvision", VIT_TUTORIAL, build_vit, vit_loss, "Adam")
    if importlib.util.find_spec("transformers") is not None:
        def build_gpt2() -> nn.Module:
            import transformers

            with torch.device("cuda"):
                return transformers.GPT2LMHeadModel(transformers.GPT2Config())

        ids = torch.randint(0, 50257, (4, 257), generator=torch.Generator().manual_seed(2))

        def gpt2_loss(model: nn.Module) -> torch.Tensor:
            batch = ids.cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(batch[:, :-1], labels=batch[:, 1:]).loss

        models["GPT-2 124M, AdamW, bf16 autocast, batch 4 x 256"] = ("transformers", GPT2_BF16, build_gpt2, gpt2_loss,
                                                                     "AdamW")
    return models


def gpu_section(args: argparse.Namespace) -> None:
    if not torch.cuda.is_available():
        print("\n5. GPU: skipped, no CUDA device is visible")
        return
    print(f"\n5. GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    models = _gpu_models()
    if not models:
        print("   skipped: neither torchvision nor transformers is installed")
    with tempfile.TemporaryDirectory() as folder:
        for i, (name, (_, text, build, loss_of, optimizer)) in enumerate(models.items()):
            if args.gpu_models and not any(key in name for key in args.gpu_models):
                continue
            script = os.path.join(folder, f"model{i}.py")
            with open(script, "w", encoding="utf-8") as handle:
                handle.write(text)
            started = time.perf_counter()
            if args.gpu_release_only:
                print(f"\n   {name}: release recipes ({args.gpu_steps} steps per run, {args.gpu_rounds} rounds), {optimizer}:")
                print_release_table(compare_release(build, loss_of, optimizer, "cuda", args.gpu_steps, args.gpu_rounds))
                print(f"   ({time.perf_counter() - started:.0f} s)")
                continue
            print(f"\n   {name}: gradlint measure --steps {args.steps} --time-steps {args.time_steps}")
            results, refused = measure_script(script, [], args.steps, time_steps=args.time_steps)
            print("   " + format_table(results, release_refused=refused).replace("\n", "\n   "))
            base = results[0]
            print("   allocator against the tensor meter, per mode (allocator peak - cuBLAS workspaces) / tensor peak:")
            for r in results:
                net = (r.allocator_peak or 0) - r.allocator.get("workspaces", 0)
                t = r.median_step_time
                print(f"     {r.mode:<18} tensor {human_bytes(r.memory.peak):>10}  "
                      f"allocator {human_bytes(r.allocator_peak or 0):>10}  "
                      f"workspaces {human_bytes(r.allocator.get('workspaces', 0)):>10}  ratio {net / r.memory.peak:.4f}"
                      f"  step {t * 1000:.1f} ms ({t / base.median_step_time:.2f}x as written)")
            fake = measure_mode(script, AS_WRITTEN, [], args.steps, fake=True)
            real = base.allocator_peak - base.allocator.get("workspaces", 0)
            print(f"   --fake ({fake.device_story}): {human_bytes(fake.memory.peak)} against the allocator's "
                  f"{human_bytes(real)} net of workspaces: {fake.memory.peak / real - 1:+.2%} (goal: within 2%)")
            print(f"   release recipes ({args.gpu_steps} steps per run, {args.gpu_rounds} rounds), {optimizer}:")
            print_release_table(compare_release(build, loss_of, optimizer, "cuda", args.gpu_steps, args.gpu_rounds))
            print(f"   ({time.perf_counter() - started:.0f} s)")
            sys.stdout.flush()


SECTIONS = ("memory", "tracer", "fake", "release", "gpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--time-steps", type=int, default=12)
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--gpu-models", nargs="*", default=[], help="run only the GPU models whose name holds one of these")
    parser.add_argument("--gpu-steps", type=int, default=20)
    parser.add_argument("--gpu-rounds", type=int, default=3)
    parser.add_argument("--gpu-release-only", action="store_true", help="on the GPU, only the release recipes' table")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    sections = {"memory": lambda: memory_section(args), "tracer": tracer_section, "fake": fake_section,
                "release": lambda: release_section(args), "gpu": lambda: gpu_section(args)}
    for name in args.only:
        sections[name]()
        sys.stdout.flush()
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
