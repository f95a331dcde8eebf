"""Recall of gradlint on real training-loop bugs that public repositories fixed.

    python bench/recall.py                          # mirrors under /work/.mirror
    python bench/recall.py --mirrors DIR --work /tmp/recall
    python bench/recall.py --bugfixes bench/realworld/heldout/bugfixes.tsv

``bench/realworld/bugfixes.tsv`` (or the file given with ``--bugfixes``, in
its columns) lists bugs chosen by what was fixed, not by
whether gradlint finds them: for each, the fixing commit, the file, the line
of the buggy statement in the fix's parent commit and the rule that should
report it (``none`` when no rule covers that kind of bug: a miss all the same).

For each bug the Python files of the parent commit are read out of a bare git
mirror (as ``bench/sweep.py`` does) into a work folder: the file's top-level
folder, or for a file at the repository root that file and its sibling
``.py`` files, so that helpers imported from beside it are seen too. gradlint
checks them (no cache, no configuration, default rules, JSON output). The bug
counts as found when a finding with the expected code is reported in that
file within ``WINDOW`` lines of the recorded line, or one whose message names
that line. The same is done on the fix
commit: a finding that is still there on the fixed code (same code, same file,
same flagged text) is listed as suspicious.

Nothing is downloaded: without the mirrors, or without the bug list, the
script says so and exits 2.
It is not part of the test suite.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import extract_python, mirror_of, read_tsv, run_gradlint  # noqa: E402

BUGFIXES = Path(__file__).resolve().parent / "realworld" / "bugfixes.tsv"

# The recorded line is the statement the fix changed or, for a missing call,
# the step or backward it belongs with; a rule reports the statement it blames
# (the step, the clear, the backward, the clip). In the loops of this set those
# are neighbours, at most three lines apart; a wider window would start to
# accept a finding on another loop of the same function.
WINDOW = 3


@dataclass(frozen=True)
class Bug:
    """One fixed bug: where it was at the fix's parent commit and which rule should report it."""

    repository: str
    fix_commit: str
    path: str
    line: int
    expected: str
    what: str
    source: str


@dataclass(frozen=True)
class Outcome:
    """What gradlint said about one bug: the matching finding's line and text, and whether the fix removed it."""

    bug: Bug
    found_line: int | None
    found_text: str = ""
    gone_after_fix: bool | None = None
    parse_error: str = ""

    @property
    def found(self) -> bool:
        """True when a finding with the expected code was reported near the buggy line."""
        return self.found_line is not None


def load_bugs(rows: list[dict[str, str]]) -> list[Bug]:
    """Rows of bugfixes.tsv as bugs; a short commit, a bad line or an empty field is an error."""
    bugs = []
    for row in rows:
        bug = Bug(row["repository"], row["fix_commit"], row["path"], int(row["line"]),
                  row["expected"], row["what"], row["source"])
        if len(bug.fix_commit) != 40 or bug.line < 1 or not all(vars(bug).values()):
            raise ValueError(f"malformed bug row: {row}")
        bugs.append(bug)
    return bugs


def scope_of(path: str) -> tuple[str, bool]:
    """What to extract for a buggy file: its top-level folder (recursively), or the root's files alone."""
    top, _, rest = path.partition("/")
    return (top, True) if rest else ("", False)


def nearest_match(bug: Bug, findings: list[dict]) -> dict | None:
    """The finding with the expected code in the bug's file closest to its line, within ``WINDOW`` lines; else one
    whose message names the buggy line (``... the step at line 307``): it sends the reader there."""
    if bug.expected == "none":
        return None
    same = [f for f in findings if f["code"] == bug.expected and _posix(f["path"]) == bug.path]
    near = [f for f in same if abs(f["line"] - bug.line) <= WINDOW]
    named = re.compile(rf"\bline {bug.line}\b")
    return min(near, key=lambda f: (abs(f["line"] - bug.line), f["line"]), default=None) or next(
        (f for f in same if named.search(f.get("message", ""))), None)


def persists(bug: Bug, found_text: str, fixed_tree: Path, fixed_findings: list[dict]) -> bool:
    """Whether the fixed commit still has a finding of the expected code on the same flagged text in that file."""
    for finding in fixed_findings:
        if finding["code"] == bug.expected and _posix(finding["path"]) == bug.path:
            if _line_text(fixed_tree / bug.path, finding["line"]) == found_text:
                return True
    return False


def parse_error_of(path: Path) -> str:
    """Why gradlint could not read the buggy file (it reports it as unchecked), or "" when it parses."""
    if not path.is_file():
        return "file not extracted"
    from gradlint.linter import parse
    from gradlint.source import SourceError, decode

    try:
        parse(decode(path.read_bytes()).text)  # as gradlint reads it (Python 3.6 names through a stand-in)
    except SourceError as error:
        return f"does not parse: {str(error).splitlines()[0].removeprefix('cannot parse: ')}"
    return ""


def tally(outcomes: list[Outcome]) -> dict[str, Counter]:
    """Per expected code (and ``all``): bugs, found, and found findings gone after the fix."""
    counts: dict[str, Counter] = {}
    for outcome in outcomes:
        for code in (outcome.bug.expected, "all"):
            count = counts.setdefault(code, Counter())
            count["bugs"] += 1
            count["found"] += outcome.found
            count["gone"] += bool(outcome.gone_after_fix)
    return counts


def markdown_table(counts: dict[str, Counter]) -> str:
    """One row per expected code (``none`` last but one), then the total, as a markdown table."""
    lines = ["| rule | bugs | found | recall | gone after the fix |", "| --- | ---: | ---: | ---: | ---: |"]
    codes = sorted(c for c in counts if c not in ("all", "none"))
    for code in codes + [c for c in ("none", "all") if c in counts]:
        count = counts[code]
        name = "**all**" if code == "all" else ("none (no rule)" if code == "none" else code)
        lines.append(f"| {name} | {count['bugs']} | {count['found']} | "
                     f"{100 * count['found'] / count['bugs']:.0f}% | {count['gone']} of {count['found']} |")
    return "\n".join(lines)


def _posix(path: str) -> str:
    return Path(path).as_posix().removeprefix("./")


def _line_text(path: Path, line: int) -> str:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _extract_scope(git_dir: Path, commit: str, path: str, target: Path) -> None:
    """Write the Python files of ``commit`` that the bug's file is checked with under ``target``."""
    folder, recursive = scope_of(path)
    if recursive:
        extract_python(git_dir, commit, target, pathspec=folder)
    else:
        extract_python(git_dir, commit, target, recursive=False)


def _findings(git_dir: Path, commit: str, bug: Bug, work: Path, cache: dict) -> tuple[Path, list[dict]]:
    """gradlint's findings on the bug's scope at ``commit``, extracted and checked once per scope."""
    folder, _ = scope_of(bug.path)
    key = (bug.repository, commit, folder)
    if key not in cache:
        tree = work / f"{bug.repository.replace('/', '+')}@{commit[:12]}" / (folder or "_root")
        if not tree.exists():
            _extract_scope(git_dir, commit, bug.path, tree)
        # files keep their repository paths under the tree, so findings name them as bugfixes.tsv does
        cache[key] = (tree, run_gradlint(tree, None))
    return cache[key]


def evaluate(bug: Bug, git_dir: Path, work: Path, cache: dict) -> Outcome:
    """Check the parent and the fix commit of one bug and say whether it was found and whether the fix cleared it."""
    parent = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", f"{bug.fix_commit}^1"],
                            check=True, capture_output=True, text=True).stdout.strip()
    tree, findings = _findings(git_dir, parent, bug, work, cache)
    match = nearest_match(bug, findings)
    if match is None:
        return Outcome(bug, None, parse_error=parse_error_of(tree / bug.path))
    text = _line_text(tree / bug.path, match["line"])
    fixed_tree, fixed_findings = _findings(git_dir, bug.fix_commit, bug, work, cache)
    return Outcome(bug, match["line"], text, not persists(bug, text, fixed_tree, fixed_findings))


def main(argv: list[str] | None = None) -> int:
    """Extract, lint, match each bug with a finding, print the table, the misses and the suspicious finds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"), help="folder of bare git mirrors")
    parser.add_argument("--work", type=Path, help="where the trees are extracted (default: a temporary folder)")
    parser.add_argument("--bugfixes", type=Path, default=BUGFIXES,
                        help="the fixed bugs to measure, in bugfixes.tsv's columns (default: the recall set)")
    args = parser.parse_args(argv)

    if not args.bugfixes.is_file():
        print(f"recall: no bug list at {args.bugfixes}", file=sys.stderr)
        return 2
    bugs = load_bugs(read_tsv(args.bugfixes))
    repositories = sorted({bug.repository for bug in bugs})
    missing = [name for name in repositories if mirror_of(args.mirrors, name) is None]
    if missing:
        print(f"recall: no git mirror under {args.mirrors} for {len(missing)} of {len(repositories)} repositories "
              f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}); fetch them first", file=sys.stderr)
        return 2

    work = args.work or Path(tempfile.mkdtemp(prefix="gradlint-recall-"))
    cache: dict = {}
    outcomes = [evaluate(bug, mirror_of(args.mirrors, bug.repository), work, cache) for bug in bugs]

    print(f"{len(bugs)} fixed bugs in {len(repositories)} repositories; found = a finding of the expected "
          f"code in the file within {WINDOW} lines of the buggy line or naming it (default rules)\n")
    print(markdown_table(tally(outcomes)))
    misses = [o for o in outcomes if not o.found]
    if misses:
        print(f"\n{len(misses)} missed:")
        for o in misses:
            unread = f" [not checked: {o.parse_error}]" if o.parse_error else ""
            print(f"- {o.bug.repository} {o.bug.path}:{o.bug.line} {o.bug.expected}: {o.bug.what}{unread}")
    suspicious = [o for o in outcomes if o.found and not o.gone_after_fix]
    if suspicious:
        print(f"\n{len(suspicious)} found but still reported after the fix:")
        for o in suspicious:
            print(f"- {o.bug.repository} {o.bug.path}:{o.found_line} {o.bug.expected} `{o.found_text}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
