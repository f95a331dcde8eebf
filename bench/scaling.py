"""How checking time grows with file size: it should grow linearly.

    python bench/scaling.py [--sizes 1 2 4 8] [--repeat 1]

Two generated shapes, each at four sizes (multiples of a base size):

- ``functions``: one training loop followed by many small functions (the
  bulk of a large module is code that never touches gradients);
- ``blocks``: one training loop of many ``backward``/``clip``/``step``
  blocks, every one a finding (the loop model and the rules ask questions of
  every step of one large loop).

For each, the CPU time of ``lint_text`` (parse, loop model, rules, positions
of the findings) is printed with its ratio to the smallest size. Linear growth
shows as a time ratio close to the size ratio; a quadratic cost would show as
the square of it.
"""

from __future__ import annotations

import argparse
import time

from gradlint.linter import lint_text

TRAINING = (
    "import torch\n"
    "model = torch.nn.Linear(2, 1)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x in data:\n"
    "    model(x).sum().backward()\n"
    "    opt.step()\n"
)

BLOCK = (
    "    loss = model(x).sum() / 4\n"
    "    scaler.scale(loss).backward()\n"
    "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    "    if (i + 1) % 4 == 0:\n"
    "        scaler.step(opt)\n"
    "        scaler.update()\n"
    "        opt.zero_grad()\n"
)


def functions(n: int) -> str:
    """A training loop and ``n`` two-line functions: ``2 n + 6`` lines."""
    return TRAINING + "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(n))


def blocks(n: int) -> str:
    """One loop of ``n`` seven-line scaled backward / clip / guarded step blocks (each clip is a GL103 finding)."""
    head = (
        "import torch\n"
        "scaler = torch.amp.GradScaler()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i, x in enumerate(data):\n"
    )
    return head + BLOCK * n


SHAPES = {"functions": (functions, 2500), "blocks": (blocks, 80)}


def seconds(text: str, repeat: int) -> tuple[float, int]:
    """The best CPU time of checking ``text`` over ``repeat`` runs, and its number of findings."""
    best, found = float("inf"), 0
    for _ in range(repeat):
        start = time.process_time()
        result = lint_text(text, "generated.py")
        best = min(best, time.process_time() - start)
        assert result.error is None, result.error
        found = len(result.findings)
    return best, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=4, default=[1, 2, 4, 8], help="multiples of each shape's base size")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size; the fastest counts")
    args = parser.parse_args()
    for shape, (make, base) in SHAPES.items():
        print(f"{shape}:")
        print(f"  {'size':>8} {'lines':>8} {'findings':>8} {'seconds':>8} {'size x':>7} {'time x':>7}")
        first = None
        for multiple in args.sizes:
            text = make(base * multiple)
            elapsed, found = seconds(text, args.repeat)
            first = first or (multiple, elapsed)
            print(
                f"  {base * multiple:>8} {text.count(chr(10)):>8} {found:>8} {elapsed:>8.2f} "
                f"{multiple / first[0]:>7.1f} {elapsed / first[1]:>7.1f}"
            )


if __name__ == "__main__":
    main()
