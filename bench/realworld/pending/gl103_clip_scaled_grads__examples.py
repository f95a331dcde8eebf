"""Buggy: gradients are clipped while still multiplied by the GradScaler's scale.

Reduced from pytorch/examples distributed/minGPT-ddp/mingpt/trainer.py (Trainer._run_batch). Without
`self.scaler.unscale_(self.optimizer)` before `clip_grad_norm_`, the norm compared with
`grad_norm_clip` is the scaled norm (about 65536 times too large), so clipping fires on every step.
"""

import torch
from torch.amp import GradScaler


class Trainer:
    def __init__(self, config, model, optimizer, train_loader):
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.train_loader = train_loader
        self.scaler = GradScaler("cuda") if config.use_amp else None

    def _run_batch(self, source, targets, train: bool = True) -> float:
        with torch.set_grad_enabled(train), torch.amp.autocast(device_type="cuda", dtype=torch.float16, enabled=self.config.use_amp):
            _, loss = self.model(source, targets)
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            if self.config.use_amp:
                self.scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)  # expect: GL103
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
                self.optimizer.step()
        return loss.item()

    def _run_epoch(self):
        for source, targets in self.train_loader:
            self._run_batch(source, targets)
