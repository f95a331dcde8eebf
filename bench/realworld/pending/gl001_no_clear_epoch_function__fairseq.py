"""Buggy: an epoch function backpropagates and steps every batch but never clears the gradients.

Reduced from facebookresearch/fairseq examples/emotion_conversion/emotion_models/duration_predictor.py
(train_epoch); pitch_predictor.py (run_epoch) has the same defect. Nothing in either file calls
zero_grad, so every step uses the sum of all gradients since the start of training.
"""

import hydra
import torch
import torch.nn as nn


def train_epoch(model, loader, criterion, optimizer, device):
    model.train()
    epoch_loss = 0
    for x, y, mask, _ in loader:
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        yhat = model(x)
        loss = torch.mean(criterion(yhat, y) * mask)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()  # expect: GL001
        epoch_loss += loss.item()
    return epoch_loss / len(loader)


def train(cfg, model, train_dl, criterion, device):
    optimizer = hydra.utils.instantiate(cfg.optimizer, model.parameters())
    for epoch in range(cfg.epochs):
        train_epoch(model, train_dl, criterion, optimizer, device)
