"""Correct: losses are summed weighted by token count, then the gradients are divided by all tokens.

Reduced from pytorch/torchtune recipes/full_finetune_single_device.py (FullFinetuneRecipeSingleDevice.train).
Each micro-batch loss (a per-token mean) is multiplied by its token count; before the step,
`training.scale_grads_(model.parameters(), 1.0 / num_tokens)` multiplies every accumulated gradient
by 1 / (tokens in the whole step): the gradient is the per-token mean of the step. The recipe
refuses optimizer-in-backward together with accumulation in its setup.
"""

import torch
from torchtune import training


class FullFinetuneRecipe:
    def __init__(self, cfg, model, loss_fn, optimizer):
        self.optimizer_in_bwd = cfg.optimizer_in_bwd
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        if self.optimizer_in_bwd and self._gradient_accumulation_steps > 1:
            raise RuntimeError("Gradient accumulation is not supported with optimizer in bwd")
        self._clip_grad_norm = cfg.get("clip_grad_norm", None)
        self._model, self._loss_fn, self.optimizer = model, loss_fn, optimizer

    def train(self, dataloader):
        num_tokens = 0
        for idx, batch in enumerate(dataloader):
            current_num_tokens = (batch["labels"] != self._loss_fn.ignore_index).sum()
            num_tokens += current_num_tokens
            # Mean loss for in-bwd optimizers, else multiply by token count
            loss_factor = current_num_tokens if not self.optimizer_in_bwd else 1.0
            current_loss = self._loss_fn(self._model(batch["tokens"]), batch["labels"]) * loss_factor
            current_loss.backward()
            if (idx + 1) % self._gradient_accumulation_steps == 0:
                if not self.optimizer_in_bwd:
                    training.scale_grads_(self._model.parameters(), 1.0 / num_tokens)
                    if self._clip_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(self._model.parameters(), float(self._clip_grad_norm))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                num_tokens = 0
