"""Buggy: a module-level linear-probe training loop that never clears the gradients.

Reduced from huggingface/peft examples/pvera/confidence_interval_generation.py. Same defect in
huggingface/peft tests/test_other.py (mock training with a new SGD per iteration over the same
model) and pytorch/examples distributed/tensor_parallelism/{fsdp_tp_example,sequence_parallel_example,
tensor_parallel_example}.py (AdamW over a parallelised model, 10 iterations, no zero_grad).
"""

import torch
from peft import PveraConfig, get_peft_model
from torch.nn import LazyLinear, Sequential, Softmax
from transformers import AutoModel

device = "cuda"
base_model = AutoModel.from_pretrained("facebook/dinov2-base")
model = get_peft_model(base_model, PveraConfig(r=128, sample_at_inference=False)).to(device)
linear_probe = Sequential(LazyLinear(3), Softmax(-1)).to(device)
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(list(model.parameters()) + list(linear_probe.parameters()), lr=1e-4)
dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 3, 224, 224), torch.randint(0, 3, (64,))), batch_size=32)
for imgs, lbls in dataloader:
    pred = linear_probe(model(imgs.to(device)).pooler_output)
    loss = criterion(pred, lbls.to(device))
    loss.backward()
    optimizer.step()  # expect: GL001
