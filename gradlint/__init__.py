"""gradlint: a linter for PyTorch training loops.

The static side (this package, ``gradlint.rules``) never imports torch; the
runtime side (``gradlint.runtime``) does and ships as the ``runtime`` extra.
"""

__version__ = "0.1.0"
