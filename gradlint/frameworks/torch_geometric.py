"""PyTorch Geometric: its graph convolution layers are modules with learnable parameters.

What it does to gradients. Nothing of its own: a layer such as ``GCNConv`` is
an ``nn.Module`` (through ``MessagePassing``) whose weights (``self.lin``, a
``bias`` parameter, attention vectors) train like any layer's, and kept in a
plain Python list they are not registered with the module that holds them.

Where it was read: ``torch_geometric/nn/conv/`` (``gcn_conv.py``:
``self.lin = Linear(...)``, ``self.bias = Parameter(...)``; ``gat_conv.py``,
``sage_conv.py``, ``cheb_conv.py`` likewise). A few ``*Conv`` classes hold no
parameter: ``SimpleConv`` and ``LGConv`` (LightGCN's propagation) only
aggregate, ``WLConv`` and ``WLConvContinuous`` hash or average colours.
Layers that wrap a network they are handed (``GINConv(nn)``, ``EdgeConv(nn)``)
hold its parameters.
"""

from __future__ import annotations

from gradlint.frameworks.framework import Framework, LayerFamily

FRAMEWORK = Framework(
    name="PyTorch Geometric",
    layers_with_parameters=(
        LayerFamily("torch_geometric.nn", "Conv", frozenset({"SimpleConv", "LGConv", "WLConv", "WLConvContinuous"})),
    ),
)
