"""Correct: each micro-batch loss is weighted by its share of the step's valid tokens before backward.

Reduced from hiyouga/LLaMA-Factory src/llamafactory/v1/core/base_trainer.py (BaseTrainer.fit).
`loss * mini_step_valid_tokens * dp_size / step_valid_tokens` makes the summed gradient of the
step the per-token mean over all its micro-batches (dp_size undoes the data-parallel mean); the
DeepSpeed branch hands that loss to the engine, which steps at the last micro-batch.
"""

import torch
import torch.distributed as dist


def compute_valid_tokens(micro_batches):
    return sum((mb["labels"] != -100).sum().item() for mb in micro_batches)


class BaseTrainer:
    def __init__(self, model, optimizer, deepspeed_engine, dp_size):
        self.model = model
        self.optimizer = optimizer
        self._deepspeed_engine = deepspeed_engine
        self.dp_size = dp_size

    def fit(self, train_batch_generator):
        for micro_batches in train_batch_generator:
            step_valid_tokens = torch.tensor(compute_valid_tokens(micro_batches))
            dist.all_reduce(step_valid_tokens, op=dist.ReduceOp.SUM)
            num_micro = len(micro_batches)
            for i, micro_batch in enumerate(micro_batches):
                loss = self.model(**micro_batch).loss
                mini_step_valid_tokens = compute_valid_tokens([micro_batch])
                loss = loss * mini_step_valid_tokens * self.dp_size / (step_valid_tokens + 1e-6)
                if self._deepspeed_engine is not None:
                    self._deepspeed_engine.accelerator.sync_gradients = i == num_micro - 1
                    self._deepspeed_engine.backward(loss)
                else:
                    loss.backward()
            if self._deepspeed_engine is None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.optimizer.zero_grad()
