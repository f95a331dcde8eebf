"""Correct: `scaler.update()` runs in the caller, right after the batch method that calls `scaler.step`.

Reduced from mosaicml/composer composer/trainer/trainer.py: `_train_batch` steps every optimizer
through `self.state.scaler.step(optimizer)` (directly or with a closure), and `_train_loop` calls
`self.state.scaler.update()` once after `_train_batch` returns.
"""

import torch
from torch.cuda.amp import GradScaler


class State:
    def __init__(self, optimizers):
        self.optimizers = optimizers
        self.scaler = GradScaler()


class Trainer:
    def __init__(self, model, optimizers):
        self.model = model
        self.state = State(optimizers)

    def _train_microbatches(self, microbatches):
        for optimizer in self.state.optimizers:
            optimizer.zero_grad()
        for microbatch in microbatches:
            loss = self.model.loss(self.model(microbatch), microbatch) / len(microbatches)
            self.state.scaler.scale(loss).backward()

    def _train_batch(self, microbatches, use_grad_scaling):
        self._train_microbatches(microbatches)
        for optimizer in self.state.optimizers:
            if use_grad_scaling:
                self.state.scaler.step(optimizer)
            else:
                optimizer.step()

    def _train_loop(self, loader, use_grad_scaling=True):
        for microbatches in loader:
            self._train_batch(microbatches, use_grad_scaling)
            if use_grad_scaling:
                self.state.scaler.update()
