"""Precision of gradlint on pinned public repositories, from triaged verdicts.

    python bench/sweep.py                          # mirrors under /work/.mirror
    python bench/sweep.py --mirrors DIR --work /tmp/sweep --select GL204
    python bench/sweep.py --repos bench/realworld/heldout/repos.tsv --verdicts bench/realworld/heldout/verdicts.tsv

``bench/realworld/repos.tsv`` (or the file given with ``--repos``, in its
columns) pins each repository to one commit. For each,
the Python files of that commit are read out of a bare git mirror
(``DIR/<owner>+<name>/repo``, or ``DIR/<owner>+<name>`` itself) into a work
folder, gradlint checks them (no cache, no configuration, JSON output), and
every finding is joined with ``bench/realworld/verdicts.tsv`` (or ``--verdicts``) by repository,
path, code and the stripped text of the flagged line (and which of several
identical lines it is), so that a verdict survives line shifts. The script
prints one markdown table (findings, true, false, untriaged and precision per
rule and overall) and the untriaged findings, ready to be triaged and
appended to the verdicts.

Nothing is downloaded: without the mirrors, or without the repository list
or the verdicts file, the script says so and exits 2.
It is not part of the test suite.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent / "realworld"
REPOS = HERE / "repos.tsv"
VERDICTS = HERE / "verdicts.tsv"
VERDICT_COLUMNS = ["repository", "commit", "path", "code", "line_text", "occurrence", "verdict", "reason"]


@dataclass(frozen=True)
class Finding:
    """One gradlint finding in a pinned repository, with the text of its line."""

    repository: str
    commit: str
    path: str
    line: int
    code: str
    line_text: str
    message: str
    occurrence: int = 1

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        """What a verdict is filed under: it does not move when lines above are added.

        ``occurrence`` tells apart findings of one code on identical lines of one file
        (the n-th such finding from the top).
        """
        return (self.repository, self.path, self.code, self.line_text, self.occurrence)


def read_tsv(path: Path) -> list[dict[str, str]]:
    """Rows of a tab-separated file with a header line (``#`` lines are comments)."""
    with path.open(newline="", encoding="utf-8") as handle:
        lines = [line for line in handle if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\"))


def load_verdicts(rows: list[dict[str, str]]) -> dict[tuple[str, str, str, str], dict[str, str]]:
    """Verdict rows keyed like ``Finding.key``; a verdict other than true/false is an error."""
    verdicts = {}
    for row in rows:
        if row["verdict"] not in ("true", "false"):
            raise ValueError(f"verdict must be true or false, not {row['verdict']!r}: {row}")
        key = (row["repository"], row["path"], row["code"], row["line_text"].strip(), int(row.get("occurrence") or 1))
        if key in verdicts:
            raise ValueError(f"two verdicts for one finding: {row}")
        verdicts[key] = row
    return verdicts


def tally(findings: list[Finding], verdicts: dict) -> tuple[dict[str, Counter], list[Finding]]:
    """Per code (and ``all``) counts of findings, true, false and untriaged; and the untriaged findings."""
    counts: dict[str, Counter] = {}
    untriaged = []
    for finding in findings:
        row = verdicts.get(finding.key)
        outcome = row["verdict"] if row else "untriaged"
        if not row:
            untriaged.append(finding)
        for code in (finding.code, "all"):
            counts.setdefault(code, Counter())
            counts[code]["findings"] += 1
            counts[code][outcome] += 1
    return counts, untriaged


def precision(count: Counter) -> float | None:
    """True findings over triaged findings, or None when nothing is triaged."""
    triaged = count["true"] + count["false"]
    return count["true"] / triaged if triaged else None


def markdown_table(counts: dict[str, Counter]) -> str:
    """One row per rule code, then the total, as a markdown table."""
    lines = ["| rule | findings | true | false | untriaged | precision |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for code in sorted(c for c in counts if c != "all") + (["all"] if "all" in counts else []):
        count = counts[code]
        value = precision(count)
        shown = "n/a" if value is None else f"{100 * value:.0f}%"
        name = "**all**" if code == "all" else code
        lines.append(
            f"| {name} | {count['findings']} | {count['true']} | {count['false']} | {count['untriaged']} | {shown} |"
        )
    return "\n".join(lines)


def mirror_of(mirrors: Path, repository: str) -> Path | None:
    """The git directory of ``owner/name`` under the mirrors folder, if it is there.

    Mirrors come bare (``repo/`` or the folder itself) or, for some repositories, as ``repo/.git``.
    """
    folder = mirrors / repository.replace("/", "+")
    for candidate in (folder / "repo", folder / "repo" / ".git", folder):
        if (candidate / "HEAD").is_file():
            return candidate
    return None


def extract_python(git_dir: Path, commit: str, target: Path, pathspec: str = "", recursive: bool = True) -> int:
    """Write the ``.py`` files of ``commit`` under ``target``; returns how many (absent blobs are skipped).

    ``pathspec`` limits them to one folder; ``recursive=False`` takes the repository root's files alone.
    Files keep their repository paths under ``target``.
    """
    command = ["git", f"--git-dir={git_dir}", "ls-tree", "-z", commit]
    if recursive:
        command.insert(3, "-r")
    if pathspec:
        command += ["--", pathspec]
    listing = subprocess.run(command, check=True, capture_output=True).stdout.decode()
    blobs = []
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind == "blob" and mode != "120000" and path.endswith(".py"):
            blobs.append((sha, path))
    batch = subprocess.run(
        ["git", f"--git-dir={git_dir}", "cat-file", "--batch"],
        input="".join(f"{sha}\n" for sha, _ in blobs).encode(), check=True, capture_output=True,
    ).stdout
    target.mkdir(parents=True, exist_ok=True)
    written, offset = 0, 0
    for sha, path in blobs:
        end = batch.index(b"\n", offset)
        header = batch[offset:end].split()
        offset = end + 1
        if header[-1] == b"missing":
            continue
        size = int(header[2])
        destination = target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(batch[offset:offset + size])
        offset += size + 1
        written += 1
    return written


def run_gradlint(tree: Path, select: str | None) -> list[dict]:
    """gradlint's JSON findings on a tree (default rules, or ``select``), paths relative to the tree."""
    command = [sys.executable, "-m", "gradlint", "check", "--no-cache", "--isolated", "--exit-zero",
               "--output-format", "json", "."]
    if select:
        command[-1:-1] = ["--select", select]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    if result.returncode not in (0, 2):
        raise RuntimeError(f"gradlint failed on {tree}: {result.stderr.strip()}")
    # Exit 2 also means a file that does not parse (real trees hold Python 2 files); an internal error of a rule is
    # a bug of gradlint, and a count that skips its file's findings would be wrong: stop and say where.
    crashed = [line for line in result.stderr.splitlines() if "internal error" in line]
    if crashed:
        raise RuntimeError(f"gradlint hit an internal error on {tree}:\n" + "\n".join(crashed))
    return json.loads(result.stdout or "[]")


def findings_of(repository: str, commit: str, tree: Path, raw: list[dict]) -> list[Finding]:
    """Findings with the stripped text of each flagged line, numbered among identical ones."""
    found, seen = [], Counter()
    for item in sorted(raw, key=lambda item: (item["path"], item["line"], item["column"], item["code"])):
        lines = (tree / item["path"]).read_text(encoding="utf-8", errors="replace").splitlines()
        text = lines[item["line"] - 1].strip() if 0 < item["line"] <= len(lines) else ""
        path = Path(item["path"]).as_posix().removeprefix("./")
        seen[(path, item["code"], text)] += 1
        occurrence = seen[(path, item["code"], text)]
        found.append(Finding(repository, commit, path, item["line"], item["code"], text, item["message"], occurrence))
    return found


def main(argv: list[str] | None = None) -> int:
    """Extract, lint, join with the verdicts, print the table and the untriaged findings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"), help="folder of bare git mirrors")
    parser.add_argument("--work", type=Path, help="where the trees are extracted (default: a temporary folder)")
    parser.add_argument("--select", help="rule codes to run instead of the defaults (e.g. GL204)")
    parser.add_argument("--untriaged-tsv", type=Path, help="also write the untriaged findings here, in verdicts.tsv's columns")
    parser.add_argument("--repos", type=Path, default=REPOS,
                        help="the pinned repositories, in repos.tsv's columns (default: the sweep set)")
    parser.add_argument("--verdicts", type=Path, default=VERDICTS,
                        help="the triaged findings, in verdicts.tsv's columns (default: the sweep's verdicts)")
    args = parser.parse_args(argv)

    for path in (args.repos, args.verdicts):
        if not path.is_file():
            print(f"sweep: no such file: {path}", file=sys.stderr)
            return 2
    repos = read_tsv(args.repos)
    missing = [row["repository"] for row in repos if mirror_of(args.mirrors, row["repository"]) is None]
    if missing:
        print(f"sweep: no git mirror under {args.mirrors} for {len(missing)} of {len(repos)} repositories "
              f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}); fetch them first", file=sys.stderr)
        return 2
    verdicts = load_verdicts(read_tsv(args.verdicts))

    work = args.work or Path(tempfile.mkdtemp(prefix="gradlint-sweep-"))
    findings, files = [], 0
    for row in repos:
        tree = work / row["repository"].replace("/", "+")
        if not tree.exists():
            files += extract_python(mirror_of(args.mirrors, row["repository"]), row["commit"], tree)
        else:
            files += sum(1 for _ in tree.rglob("*.py"))
        findings += findings_of(row["repository"], row["commit"], tree, run_gradlint(tree, args.select))

    counts, untriaged = tally(findings, verdicts)
    print(f"{len(repos)} repositories, {files} Python files, {len(findings)} findings "
          f"(rules: {args.select or 'default'})\n")
    print(markdown_table(counts))
    if untriaged:
        print(f"\n{len(untriaged)} untriaged:")
        for f in untriaged:
            print(f"- {f.repository} {f.path}:{f.line} {f.code} `{f.line_text}`")
    if args.untriaged_tsv:
        with args.untriaged_tsv.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
            writer.writerow(VERDICT_COLUMNS + ["line", "message"])
            for f in untriaged:
                # one row per finding: a message quoting a statement of several lines is written on one line
                writer.writerow([f.repository, f.commit, f.path, f.code, f.line_text, f.occurrence, "", "", f.line,
                                 " ".join(f.message.split())])
    return 0


if __name__ == "__main__":
    sys.exit(main())
