"""Buggy (performance): a DDP model accumulates micro-batches without no_sync(), all-reducing each one.

Reduced from microsoft/Swin-Transformer main_simmim_pt.py (train_one_epoch); main_simmim_ft.py is the
same. NVIDIA/apex apex/contrib/test/optimizers/test_dist_adam.py's DDP reference path does the same.
(Also wrong here but not flagged today: `scaler.unscale_` on every micro-batch raises
"unscale_() has already been called on this optimizer since the last update()" on the second one.)
"""

import torch
from torch.cuda import amp


def train_one_epoch(config, model, data_loader, optimizer, scaler):
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[config.LOCAL_RANK], broadcast_buffers=False)
    model.train()
    optimizer.zero_grad()
    for idx, (img, mask, _) in enumerate(data_loader):
        img = img.cuda(non_blocking=True)
        mask = mask.cuda(non_blocking=True)
        with amp.autocast(enabled=config.ENABLE_AMP):
            loss = model(img, mask)
        loss = loss / config.TRAIN.ACCUMULATION_STEPS
        scaler.scale(loss).backward()  # expect: GL302
        if (idx + 1) % config.TRAIN.ACCUMULATION_STEPS == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.TRAIN.CLIP_GRAD)
            scaler.step(optimizer)
            optimizer.zero_grad()
            scaler.update()
