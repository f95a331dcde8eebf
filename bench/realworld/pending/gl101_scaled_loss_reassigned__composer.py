"""Correct: the loss is replaced by `scaler.scale(loss)` before it is scaled in place and backpropagated.

Reduced from mosaicml/composer composer/trainer/trainer.py (Trainer._train_microbatch). Under
`use_grad_scaling` the name `microbatch_loss` is rebound to `cast(torch.Tensor, self.state.scaler.scale(microbatch_loss))`
(a typing cast, which returns its argument);
the later `mul_` and `backward()` act on the scaled loss, and the step goes through `scaler.step`.
"""

from typing import cast

import torch
from torch.cuda.amp import GradScaler


class Trainer:
    def __init__(self, model, optimizer, use_grad_scaling):
        self.model = model
        self.optimizer = optimizer
        self.scaler = GradScaler(enabled=use_grad_scaling)
        self.use_grad_scaling = use_grad_scaling

    def _train_microbatch(self, batch):
        microbatch_loss = self.model.loss(self.model(batch), batch)
        if self.use_grad_scaling:
            microbatch_loss = cast(torch.Tensor, self.scaler.scale(microbatch_loss))
        microbatch_loss.mul_(1.0)
        microbatch_loss.backward()

    def fit(self, loader):
        for batch in loader:
            self.optimizer.zero_grad()
            self._train_microbatch(batch)
            if self.use_grad_scaling:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
