"""mkdocs hooks: the README is the site's home page, and every rule page is in the navigation.

The README lives at the repository root, where people and package indexes
read it, and links to the documentation as ``docs/PAGE.md``. The site gets
it as ``index.md`` with those links made relative to ``docs/``. The rule
pages are generated (``python -m gradlint.generate``), one per rule: the
navigation lists whatever pages ``docs/rules/`` holds.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
README = ROOT / "README.md"
# A markdown link or image target that starts with ``docs/``.
_DOCS_LINK = re.compile(r"\]\(docs/")


def on_config(config):
    """List every rule page under the Rules section of the navigation, after the index."""
    pages = sorted(path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs" / "rules").glob("GL*.md"))
    for index, entry in enumerate(config["nav"]):
        if entry == {"Rules": "rules/index.md"}:
            config["nav"][index] = {"Rules": ["rules/index.md", *pages]}
    return config


def on_files(files: Files, config) -> Files:
    """Add the README, its links into ``docs/`` rewritten, as the home page ``index.md``."""
    text = _DOCS_LINK.sub("](", README.read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files
