"""Which model classes' ``forward`` returns a loss summed over tokens (``gradlint.summed_losses``), read from source."""

from __future__ import annotations

import textwrap

import pytest

from gradlint.project_index import python_tree
from gradlint.summed_losses import may_sum, summing_forwards


def _found(source: str) -> frozenset[str]:
    text = textwrap.dedent(source)
    assert may_sum(text)
    return summing_forwards(python_tree(text))


def test_a_reduction_parameter_defaulting_to_sum_at_its_place_in_the_returned_tuple():
    assert _found('''
        import torch.nn.functional as F
        class Model:
            def forward(self, x, y, reduction="sum"):
                total_loss = 0.0
                total_loss += F.cross_entropy(self.head(x).view(-1, 10), y.view(-1), reduction=reduction) * 0.5
                total_loss = total_loss / 2.0
                return (x, total_loss, {})
    ''') == {"Model:1"}


def test_a_literal_sum_returned_alone():
    assert _found('''
        import torch.nn.functional as F
        class Model:
            def forward(self, x, y):
                loss = F.mse_loss(self.net(x), y, reduction="sum")
                return loss
    ''') == {"Model:-1"}


@pytest.mark.parametrize("body", [
    # the default is a mean
    'def forward(self, x, y, reduction="mean"):\n    loss = F.cross_entropy(x, y, reduction=reduction)\n    return loss  # "sum"',
    # the sum divided by the token count is a mean
    'def forward(self, x, y, reduction="sum"):\n    loss = F.cross_entropy(x, y, reduction=reduction)\n    loss = loss / y.numel()\n    return loss',
    # a criterion with its default mean reduction beside the summed one
    'def forward(self, x, y, reduction="sum"):\n    loss = F.cross_entropy(x, y, reduction=reduction) + F.mse_loss(x, y)\n    return loss',
    # another call on the way: unknown
    'def forward(self, x, y, reduction="sum"):\n    loss = self.weigh(F.cross_entropy(x, y, reduction=reduction))\n    return loss',
    # an explicit mean
    'def forward(self, x, y, reduction="sum"):\n    loss = F.cross_entropy(x, y, reduction=reduction).mean()\n    return loss',
    # two returns put the loss at different places
    'def forward(self, x, y, reduction="sum"):\n    loss = F.cross_entropy(x, y, reduction=reduction)\n    if x is None:\n        return loss\n    return x, loss',
    # the loss is unpacked from something not read
    'def forward(self, x, y, reduction="sum"):\n    loss, aux = self.compute(x, y, reduction=reduction)\n    return loss',
])
def test_not_certainly_a_sum(body):
    source = "import torch.nn.functional as F\nclass Model:\n" + textwrap.indent(body, "    ") + "\n"
    assert _found(source) == frozenset()


def test_a_name_counts_only_when_every_class_built_into_it_sums_or_wraps_for_data_parallelism():
    from gradlint.project_index import _summing_models

    summing = {"VALLE": "1", "Other": "-1"}
    assert _summing_models(frozenset({"model:VALLE", "model:DistributedDataParallel"}), summing) == ["model:1"]
    assert _summing_models(frozenset({"model:VALLE", "model:Transformer"}), summing) == []  # built from an unread class too
    assert _summing_models(frozenset({"model:VALLE", "model:Other"}), summing) == []  # the loss at two places
    assert _summing_models(frozenset({"net:Transformer"}), summing) == []
