"""A small language-model training script with three silent gradient bugs.

Run ``gradlint examples/train.py`` to see them; ``gradlint --fix`` repairs the safe ones.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import AdamW
from torch.optim.lr_scheduler import OneCycleLR


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 256, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.block = nn.TransformerEncoderLayer(width, nhead=4, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


def batches(steps: int, batch_size: int, length: int = 32):
    for _ in range(steps):
        tokens = torch.randint(0, 256, (batch_size, length + 1))
        yield tokens[:, :-1], tokens[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyLM()
    optimizer = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    scheduler = OneCycleLR(optimizer, max_lr=3e-4, total_steps=args.steps)
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)

    for i, (inputs, targets) in enumerate(batches(args.steps, batch_size=8)):
        optimizer.zero_grad()  # cleared on every micro-batch: accumulation never happens
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        scaler.scale(loss).backward()  # the loss is not divided by args.accum
        if (i + 1) % args.accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clipped while still scaled
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
        if i % 10 == 0:
            print(f"step {i:4d}  loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
