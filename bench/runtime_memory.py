"""Peak memory of a transformer-like stack with AdamW, measured in three modes next to an analytic model.

    python bench/runtime_memory.py [--blocks 4 --width 256 --seq 64 --batches 1 32 --steps 3]

For each batch size, the loop of ``fixtures/run_llm_shaped.py`` runs as
written, with ``set_to_none=True`` and with fused gradient release, under the
exact CPU tensor meter. The analytic model, from the parameter shapes and one
forward-only measurement of the activations:

    plain   ~ P + G + 2P (Adam moments) + T + A
    release ~ P + max(g) + 2P + T + A

P: parameter bytes, G = P: gradient bytes, max(g): the largest single
gradient, T: AdamW's per-tensor temporaries (about 2 x the largest parameter),
A: activations kept for backward. The model adds every term as if all were
alive at once, so it is an upper bound: a ratio below 1 shows how much of it
never coexists (activations are freed by backward while gradients appear).
Step times are medians between step() calls under the meter, reported as a
ratio to the as-written run of the same batch size.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "fixtures", "run_llm_shaped.py")
sys.path.insert(0, os.path.dirname(SCRIPT))

from run_llm_shaped import LanguageModel  # noqa: E402

from gradlint.runtime.measure import AS_WRITTEN, RELEASE, human_bytes, measure_script  # noqa: E402
from gradlint.runtime.memory import TensorMemoryMeter  # noqa: E402


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
        logits = real(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        activations = meter.current - P
        del loss, logits
    return {"P": P, "G": P, "S": 2 * P, "T": 2 * largest, "A": activations, "g_max": largest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    started = time.perf_counter()
    print(f"transformer-like stack: {args.blocks} blocks, width {args.width}, MLP {hidden_of(args.width)}, "
          f"vocab {args.vocab}, seq {args.seq}, AdamW fp32, {args.steps} steps per mode, torch {torch.__version__}")
    for batch in args.batches:
        terms = analytic(args, batch)
        predicted = {
            AS_WRITTEN: terms["P"] + terms["G"] + terms["S"] + terms["T"] + terms["A"],
            RELEASE: terms["P"] + terms["g_max"] + terms["S"] + terms["T"] + terms["A"],
        }
        script_args = [f"--{k}={getattr(args, k)}" for k in ("blocks", "width", "heads", "vocab", "seq")]
        results, refused = measure_script(SCRIPT, [*script_args, f"--batch={batch}"], args.steps)
        print()
        print(f"batch {batch}: P={human_bytes(terms['P'])}  A={human_bytes(terms['A'])}  "
              f"largest gradient={human_bytes(terms['g_max'])}")
        print(f"  {'mode':<18} {'measured peak':>14} {'predicted':>12} {'measured/predicted':>19} "
              f"{'grads at peak':>14} {'acts at peak':>13} {'step time ratio':>16}")
        base_time = results[0].median_step_time or float("nan")
        for r in results:
            pred = predicted.get(r.mode, predicted[AS_WRITTEN])
            t = r.median_step_time or float("nan")
            print(f"  {r.mode:<18} {human_bytes(r.memory.peak):>14} {human_bytes(pred):>12} "
                  f"{r.memory.peak / pred:>19.3f} {human_bytes(r.memory.split['gradients']):>14} "
                  f"{human_bytes(r.memory.split['activations']):>13} {t / base_time:>16.2f}")
        by_mode = {r.mode: r.memory.peak for r in results}
        if refused:
            print(f"  gradient release refused: {refused}")
        else:
            saving = by_mode[AS_WRITTEN] - by_mode[RELEASE]
            print(f"  release vs as written: {saving / by_mode[AS_WRITTEN]:+.1%} of the peak saved"
                  if saving > 0 else f"  release vs as written: peak {-saving / by_mode[AS_WRITTEN]:.1%} HIGHER")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
