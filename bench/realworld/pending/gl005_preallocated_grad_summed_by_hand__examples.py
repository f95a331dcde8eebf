"""Correct: .grad is pre-allocated and summed into by hand, so it must not be set to None.

Reduced from pytorch/examples distributed/rpc/batch/parameter_server.py (BatchUpdateParameterServer).
Workers' gradients are added with `p.grad += g`; after a batch of updates the server averages,
steps, and zeroes in place, because the next `p.grad += g` needs a tensor to add into.
"""

import threading

import torch
import torch.optim as optim
import torchvision


class BatchUpdateParameterServer:
    def __init__(self, batch_update_size):
        self.model = torchvision.models.resnet50(num_classes=1000)
        self.lock = threading.Lock()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.001, momentum=0.9)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def update_and_fetch_model(self, grads):
        for p, g in zip(self.model.parameters(), grads):
            p.grad += g
        with self.lock:
            self.curr_update_size += 1
            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
        return self.model
