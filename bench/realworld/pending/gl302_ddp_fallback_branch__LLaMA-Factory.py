"""Buggy (performance): the DDP fallback backpropagates every micro-batch of a step without no_sync().

Reduced from hiyouga/LLaMA-Factory src/llamafactory/v1/core/base_trainer.py (BaseTrainer.__init__ and
fit). When no distributed plugin is configured the model is wrapped in DistributedDataParallel, and
fit() calls loss.backward() on each of a step's micro-batches: each one all-reduces. The DeepSpeed
branch beside it is fine (the engine syncs at the boundary); the finding belongs on the DDP branch.
The loss is weighted by its share of the step's tokens (as in gl004_token_weighted_loss__LLaMA-Factory.py).
"""

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def compute_valid_tokens(micro_batches):
    return sum((mb["labels"] != -100).sum().item() for mb in micro_batches)


class BaseTrainer:
    def __init__(self, model, optimizer, deepspeed_engine, local_rank):
        self._deepspeed_engine = deepspeed_engine
        self.model = model
        self.optimizer = optimizer
        if deepspeed_engine is None:
            self.model = DDP(self.model, device_ids=[local_rank])

    def fit(self, train_batch_generator):
        for micro_batches in train_batch_generator:
            step_valid_tokens = compute_valid_tokens(micro_batches)
            num_micro = len(micro_batches)
            for i, micro_batch in enumerate(micro_batches):
                loss = self.model(**micro_batch).loss
                loss = loss * compute_valid_tokens([micro_batch]) / (step_valid_tokens + 1e-6)
                if self._deepspeed_engine is not None:
                    self._deepspeed_engine.accelerator.sync_gradients = i == num_micro - 1
                    self._deepspeed_engine.backward(loss)
                else:
                    loss.backward()  # expect: GL302
            if self._deepspeed_engine is None:
                self.optimizer.step()
                self.optimizer.zero_grad()
