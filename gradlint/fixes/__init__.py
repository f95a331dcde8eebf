"""Automatic fixes: one module per rule family, each building edits from the loop model's events.

A rule attaches a :class:`Fix` to its report; :mod:`gradlint.fixer` decides
which fixes to apply (safe ones, plus unsafe ones when asked), applies them
and writes the file.

- ``clearing``: GL001–GL005
- ``amp``: GL101–GL104
- ``schedule``: GL301
- ``fuse_into_backward``: GL204, the rewrite to gradient release with torch-optimi
"""

from gradlint.fixes.edits import CannotApply, Edit, Fix, apply_edits

__all__ = ["CannotApply", "Edit", "Fix", "apply_edits"]
