"""Correct: a deliberate sum: the loss is per image and gradients add up to a nominal batch of 64.

Reduced from ultralytics/yolov5 train.py (same loop in segment/train.py). `compute_loss` returns
`loss * batch_size` ('loss scaled by batch_size'), micro-batches accumulate until `nbs` images
were seen, and the hyperparameters (weight decay scaled by batch_size * accumulate / nbs, the
learning rates) are tuned for the summed gradient of 64 images. Dividing would change the recipe.
"""

import numpy as np
import torch
from torch import nn


def train(model, optimizer, train_loader, compute_loss, hyp, batch_size, device, amp=True):
    nbs = 64  # nominal batch size
    accumulate = max(round(nbs / batch_size), 1)  # accumulate loss before optimizing
    hyp["weight_decay"] *= batch_size * accumulate / nbs  # scale weight_decay
    scaler = torch.cuda.amp.GradScaler(enabled=amp)
    last_opt_step = -1
    optimizer.zero_grad()
    for i, (imgs, targets) in enumerate(train_loader):
        imgs = imgs.to(device, non_blocking=True).float() / 255
        with torch.cuda.amp.autocast(amp):
            pred = model(imgs)
            loss, loss_items = compute_loss(pred, targets.to(device))  # loss scaled by batch_size
        scaler.scale(loss).backward()
        if i - last_opt_step >= accumulate:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            last_opt_step = i
