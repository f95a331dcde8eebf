"""Runtime side of gradlint: run a training loop to confirm findings and measure memory.

Needs torch (the ``runtime`` extra). Nothing in the static linter imports this package.
"""
