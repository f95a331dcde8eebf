"""The ``gradlint`` command line.

``gradlint PATH...`` (or ``gradlint check PATH...``) lints; ``gradlint rule
GL003`` and ``gradlint rules`` document the rules. Exit status: 0 clean,
1 findings, 2 when something could not be checked or the arguments are wrong.

Start-up is kept short: this module imports no rule, no LibCST and no torch.
The rules are known here by their catalogue entries (codes, names, prefilter
tokens); the runner imports the rules and the parser when a file passes the
prefilter, and ``--fix``, ``--diff``, stdin, SARIF and ``gradlint rule``
import what they need when they run (``tests/test_startup.py``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from gradlint import __version__, catalogue
from gradlint.config import Config, ConfigError, find_pyproject, load_config, validate_codes
from gradlint.cache import CACHE_DIR_NAME, Cache
from gradlint.output import (
    all_findings,
    format_errors,
    format_github,
    format_json,
    format_sarif,
    format_statistics,
    format_text,
    summary,
    unsafe_hint,
)
from gradlint import baseline
from gradlint.baseline import FileLines
from gradlint.ruledoc import find_rule, render_markdown, render_text
from gradlint.runner import run
from gradlint.stdin import STDIN, check_stdin, encode_like
from gradlint.runtime.commands import measure_command, run_command

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class _DefaultToCheck(click.Group):
    """A group whose first argument, when it is not a subcommand, is a path for ``check``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["check", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToCheck, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="gradlint")
def main() -> None:
    """gradlint: find the gradient bugs PyTorch never reports in training loops."""


def _codes(values: tuple[str, ...], option: str) -> list[str]:
    codes = [c for value in values for c in value.split(",")]
    try:
        return validate_codes(codes, catalogue.RULES_BY_CODE, option)
    except ConfigError as error:
        raise click.BadParameter(str(error).split(": ", 1)[-1], param_hint=option) from error


@main.command(short_help="Lint files and folders (the default command).")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--select", multiple=True, metavar="CODES", help="Only these rule codes or prefixes (comma-separated).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Skip these rule codes or prefixes (comma-separated).")
@click.option(
    "--output-format",
    type=click.Choice(["text", "json", "sarif", "github"]),
    default="text",
    show_default=True,
    help="json: a list of findings; sarif: SARIF 2.1.0 for code scanning; github: GitHub Actions annotations.",
)
@click.option("--statistics", is_flag=True, help="Also print how many findings each rule code has.")
@click.option("--show-links", is_flag=True, help="Text output: after each finding, the address of its rule's page.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), metavar="N", help="Check files in N processes (default: one per core).")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache.")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help=f"Where the result cache lives (default: {CACHE_DIR_NAME} beside the configuration, or in the current folder).",
)
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("-q", "--quiet", is_flag=True, help="Print findings and errors only: no summary lines.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Read [tool.gradlint] from this file.")
@click.option("--isolated", is_flag=True, help="Ignore every configuration file.")
@click.option("--force-exclude", is_flag=True, help="Apply the excludes to paths named on the command line too.")
@click.option(
    "--stdin-filename",
    metavar="PATH",
    help="With PATHS `-`: the name of the source read from stdin (for its configuration and in the output).",
)
@click.option("--no-prefilter", is_flag=True, hidden=True, help="Parse every file, even those no rule could fire on.")
@click.option("--fix", is_flag=True, help="Apply the safe fixes, then report what is left (stdin: print the fixed source).")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix or --diff: also apply the fixes that change numbers.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff and write nothing (exit 1 if there is any).")
@click.option(
    "--baseline", "baseline_path", type=click.Path(dir_okay=False), metavar="FILE", help="Report only the findings FILE does not record."
)
@click.option(
    "--write-baseline", type=click.Path(dir_okay=False), metavar="FILE", help="Record today's findings in FILE (for --baseline) and exit."
)
def check(
    paths, select, ignore, output_format, statistics, show_links, jobs, no_cache, cache_dir, exit_zero, quiet, config_path, isolated, force_exclude,
    stdin_filename, no_prefilter, fix, unsafe_fixes, diff, baseline_path, write_baseline,
) -> None:
    """Lint PATHS (files or folders; default: the current folder; `-`: stdin)."""
    # Source on stdin is configured as the file it names, wherever the editor runs gradlint from.
    config = _effective_config(select, ignore, config_path, isolated, Path(stdin_filename).absolute().parent if stdin_filename else None)
    if force_exclude:
        config = dataclasses.replace(config, force_exclude=True)
    if baseline_path and write_baseline:
        raise click.UsageError("--baseline and --write-baseline do not go together")
    stdin = paths == (STDIN,) or (not paths and stdin_filename is not None)
    if STDIN in paths and not stdin:
        raise click.UsageError("`-` (read stdin) takes no other path")
    if stdin_filename is not None and not stdin:
        raise click.UsageError("--stdin-filename names the source read from stdin: give `-` as the only path")
    known = _load_baseline(baseline_path) if baseline_path else None
    prefilter = not no_prefilter
    lines, fixed = FileLines(), None
    if stdin:
        results, fixed, lines = _check_stdin(stdin_filename or STDIN, config, fix, diff, unsafe_fixes, prefilter, quiet)
    elif diff:
        from gradlint.fixer import fix_paths

        _show_diff(fix_paths(paths or (".",), config, unsafe=unsafe_fixes, write=False, prefilter=prefilter, jobs=jobs), unsafe_fixes, quiet)
    elif fix:
        from gradlint.fixer import fix_paths

        outcomes = fix_paths(paths or (".",), config, unsafe=unsafe_fixes, prefilter=prefilter, jobs=jobs)
        results = [o.result for o in outcomes]
        fixed = sum(o.fixed for o in outcomes)
    else:
        cache = None if no_cache else Cache(Path(cache_dir) if cache_dir else config.root / CACHE_DIR_NAME)
        results = run(paths or (".",), config, jobs=jobs, cache=cache, prefilter=prefilter)
    if write_baseline:
        _write_baseline(write_baseline, results, config, lines, quiet)
    hidden = None
    if known is not None:
        results, hidden = baseline.only_new(results, known, config, lines)
    _report(results, output_format, statistics, fixed, unsafe_fixes, hidden, quiet, to_stderr=stdin and fix, links=show_links)
    if any(r.error for r in results):
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_FINDINGS if all_findings(results) and not exit_zero else EXIT_CLEAN)


def _check_stdin(filename: str, config: Config, fix: bool, diff: bool, unsafe: bool, prefilter: bool, quiet: bool):
    """Check the source on stdin as ``filename``: its results, the number of fixes (with ``fix``) and its lines.

    ``--diff`` prints the diff and exits; ``--fix`` writes the fixed source
    (or the source as it came, when nothing applies) to stdout, like ruff.
    """
    data = click.get_binary_stream("stdin").read()
    outcome = check_stdin(data, filename, config, fix=fix or diff, unsafe=unsafe, prefilter=prefilter)
    outcomes = [outcome] if outcome is not None else []
    if diff:
        _show_diff(outcomes, unsafe, quiet)
    if fix:
        click.get_binary_stream("stdout").write(encode_like(outcome, data) if outcome is not None else data)
    lines = FileLines({o.path: o.text for o in outcomes})
    return [o.result for o in outcomes], sum(o.fixed for o in outcomes) if fix else None, lines


def _load_baseline(path: str):
    """``--baseline``: the findings the file records, read before anything is checked; a bad file is a usage error."""
    try:
        return baseline.load(path)
    except baseline.BaselineError as error:
        raise click.UsageError(str(error)) from error


def _report(
    results, output_format: str, statistics: bool, fixed, unsafe: bool, hidden, quiet: bool, *, to_stderr: bool, links: bool = False
) -> None:
    """Print the errors (stderr), the findings in ``output_format`` (text: with ``links``, each rule's page) and, for text, the summary line."""
    findings = all_findings(results)
    errors = format_errors(results)
    if errors:
        click.echo(errors, nl=False, err=True)
    if output_format == "json":
        click.echo(format_json(findings), nl=False, err=to_stderr)
    elif output_format == "sarif":
        from gradlint.rules import ALL_RULES  # every rule's documentation goes into the log

        click.echo(format_sarif(findings, results, ALL_RULES, Path.cwd()), nl=False, err=to_stderr)
    elif output_format == "github":
        click.echo(format_github(findings), nl=False, err=to_stderr)
    else:
        click.echo(format_text(findings, links=links), nl=False, err=to_stderr)
    if statistics:  # beside a machine-readable format, on stderr
        click.echo(format_statistics(findings), nl=False, err=to_stderr or output_format != "text")
    if output_format == "text" and not quiet:
        line = summary(results, fixed, unsafe=unsafe)
        if hidden:
            line = line.rstrip("\n") + f" {hidden} baseline finding{'s' if hidden != 1 else ''} not shown.\n"
        click.echo(line, nl=False, err=to_stderr)


def _write_baseline(path: str, results, config: Config, lines: FileLines, quiet: bool) -> None:
    """``--write-baseline``: record every finding of the run in ``path`` and exit (2 if a file could not be checked)."""
    try:
        count = baseline.write(path, all_findings(results), config, lines)
    except baseline.BaselineError as error:
        raise click.UsageError(str(error)) from error
    errors = format_errors(results)
    if errors:
        click.echo(errors, nl=False, err=True)
    if not quiet:
        click.echo(f"Wrote a baseline of {count} finding{'s' if count != 1 else ''} to {path}.", err=True)
    sys.exit(EXIT_ERROR if errors else EXIT_CLEAN)


def _show_diff(outcomes, unsafe: bool, quiet: bool) -> None:
    """``--diff``: print what fixing would change, write nothing, and exit (1 when there is a change)."""
    from gradlint.fixer import unified_diff

    for outcome in outcomes:
        click.echo(unified_diff(outcome), nl=False)
    errors = format_errors([o.result for o in outcomes])
    if errors:
        click.echo(errors, nl=False, err=True)
    changed = [o for o in outcomes if o.changed]
    fixes = sum(o.fixed for o in changed)
    hint = "" if unsafe else unsafe_hint(all_findings([o.result for o in outcomes]))
    if not quiet:
        click.echo(f"Would fix {fixes} problem{'s' if fixes != 1 else ''} in {len(changed)} file{'s' if len(changed) != 1 else ''}.{hint}", err=True)
    sys.exit(EXIT_ERROR if errors else EXIT_FINDINGS if changed else EXIT_CLEAN)


def _effective_config(select, ignore, config_path, isolated, start: Path | None = None) -> Config:
    """The configuration of a run: ``--config``, or the nearest one above ``start`` (the current folder), then the options."""
    try:
        if isolated:
            config = Config()
        else:
            pyproject = Path(config_path) if config_path else find_pyproject(start or Path.cwd())
            config = load_config(pyproject, catalogue.RULES_BY_CODE)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if select:
        config = dataclasses.replace(config, select=tuple(_codes(select, "--select")))
    if ignore:
        config = dataclasses.replace(config, ignore=config.ignore + tuple(_codes(ignore, "--ignore")))
    return config


@main.command("rule", short_help="Explain one rule, by code or name, or --all.")
@click.argument("rule", required=False)
@click.option("--all", "show_all", is_flag=True, help="Every rule, one after another.")
@click.option(
    "--output-format",
    type=click.Choice(["text", "markdown"]),
    default="text",
    show_default=True,
    help="text: for a terminal; markdown: for docs and issues.",
)
def rule_command(rule: str | None, show_all: bool, output_format: str) -> None:
    """Explain RULE, given by code or name (GL003, zero-grad-in-accumulation)."""
    from gradlint.rules import ALL_RULES  # the documentation is the rule classes' docstrings

    if show_all == (rule is not None):
        raise click.UsageError("name one rule, or give --all")
    if show_all:
        chosen = list(ALL_RULES)
    else:
        found = find_rule(rule, ALL_RULES)
        if found is None:
            raise click.BadParameter(f"no rule {rule!r}; `gradlint rules` lists them", param_hint="RULE")
        chosen = [found]
    render = render_markdown if output_format == "markdown" else render_text
    click.echo("\n".join(render(r) for r in chosen), nl=False)


@main.command("rules")
def rules_command() -> None:
    """List every rule: code, name, severity, fix and what it flags."""
    for rule in catalogue.ALL_RULES:
        fix = rule.fix.value if rule.fix else "-"
        default = "" if rule.enabled_by_default else " (off unless selected)"
        click.echo(f"{rule.code}  {rule.name:<40} {rule.severity.value:<8} fix: {fix:<7} {rule.summary}{default}")


# The runtime commands import torch only when they run. Their listing in
# `gradlint --help` gets a line short enough for an 80-column terminal.
run_command.short_help = run_command.short_help or "Run a script a few steps; confirm or refute its findings."
measure_command.short_help = measure_command.short_help or "Measure memory and step time, as written and fused."
main.add_command(run_command)
main.add_command(measure_command)

if __name__ == "__main__":  # pragma: no cover
    main()
