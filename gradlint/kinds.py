"""The kinds of object the loop model tracks, in its own words (no framework's)."""

from __future__ import annotations

import enum


class ObjKind(str, enum.Enum):
    """The kinds of object the loop model tracks."""

    OPTIMIZER = "optimizer"
    SCALER = "scaler"
    SCHEDULER = "scheduler"
    MODEL = "model"
    PARALLEL_MODEL = "parallel_model"  # a model wrapped for data parallelism: its backward all-reduces the gradients
    # An object whose ``prepare``/``setup`` wraps models and optimizers for the run and through which the loss is
    # backpropagated (a framework's central object: :mod:`gradlint.frameworks` says whose)
    PREPARER = "preparer"
    ENGINE = "engine"  # an engine whose backward divides by its accumulation count and syncs at its own boundary
    TENSOR = "tensor"  # one named tensor whose .grad the code handles by hand (``delta.grad``)
    OTHER = "other"  # known to be none of these, whatever its name says (``ema_optimizer = WeightEMA(...)``)
    UNKNOWN = "unknown"
