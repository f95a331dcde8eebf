"""Correct: each micro-batch loss is scaled in place by its share of the batch before backward.

Reduced from mosaicml/composer composer/trainer/trainer.py (Trainer._train_microbatches and
_train_microbatch). `microbatch_loss.mul_(microbatch_size / current_batch_size)` weights every
micro-batch by its fraction of the device batch, so the accumulated gradient is the batch mean.
"""

import torch


class Trainer:
    def __init__(self, model, optimizer, split_batch):
        self.model = model
        self.optimizer = optimizer
        self.split_batch = split_batch

    def _train_microbatch(self, microbatch, current_batch_size):
        microbatch_size = microbatch["input_ids"].shape[0]
        outputs = self.model(microbatch)
        microbatch_loss = self.model.loss(outputs, microbatch)
        microbatch_loss.mul_(microbatch_size / current_batch_size)
        microbatch_loss.backward()

    def train_batch(self, device_batch, microbatch_size):
        current_batch_size = device_batch["input_ids"].shape[0]
        self.optimizer.zero_grad()
        for microbatch in self.split_batch(device_batch, microbatch_size):
            self._train_microbatch(microbatch, current_batch_size)
        self.optimizer.step()

    def fit(self, loader, microbatch_size):
        for device_batch in loader:
            self.train_batch(device_batch, microbatch_size)
