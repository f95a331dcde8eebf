"""The runtime's figures, each next to an independent check, in one run.

    python bench/runtime_memory.py [--batches 1 32] [--time-steps 12]

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
import itertools
import os
import platform
import statistics
import sys
import time

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
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    memory_section(args)
    tracer_section()
    fake_section()
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
