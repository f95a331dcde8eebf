"""Click commands of the runtime: ``gradlint run`` and ``gradlint measure``.

This module imports no torch; the commands import it when they run, so the
main CLI can register them without slowing the static linter down.
"""

from __future__ import annotations

import sys

import click

_CONTEXT = {"ignore_unknown_options": True}


def _require_torch(command: str) -> None:
    """Stop with one clear line when torch (the runtime extra) is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        click.echo(f"gradlint {command}: needs torch: pip install torch, then pip install 'gradlint[runtime]'", err=True)
        sys.exit(2)


@click.command("run", context_settings=_CONTEXT)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Optimizer steps to run.")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(script: str, steps: int, script_args: tuple[str, ...]) -> None:
    """Run SCRIPT for a few optimizer steps and confirm or refute its static findings.

    Arguments after ``--`` go to the script. Exit 1 when a finding is confirmed,
    0 otherwise, 2 when the script could not be judged.
    """
    _require_torch("run")
    from gradlint.runtime.run import RunError, format_report, run_and_judge, static_findings

    try:
        findings = static_findings(script)
        if findings is None:
            click.echo("note: the static linter (gradlint.linter) is not installed; showing the trace only", err=True)
            findings = []
        report = run_and_judge(script, findings, script_args, steps)
    except RunError as err:
        click.echo(f"gradlint run: {script}: {err}", err=True)
        sys.exit(2)
    click.echo(format_report(report))
    sys.exit(1 if report.confirmed else 0)


@click.command("measure", context_settings=_CONTEXT)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=2), help="Optimizer steps per mode.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG of memory over one step.")
@click.option("--fake", is_flag=True, help="Estimate on fake tensors: nothing is allocated.")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def measure_command(script: str, steps: int, plot_path: str | None, fake: bool, script_args: tuple[str, ...]) -> None:
    """Measure SCRIPT as written, with set_to_none=True and with fused gradient release.

    Prints peak memory with its split, median step time and the largest
    parameter difference from the as-written run. Arguments after ``--`` go
    to the script. Exit 2 when a mode could not be measured.
    """
    _require_torch("measure")
    from gradlint.runtime.measure import MeasureError, format_table, measure_script, plot

    from gradlint.progress import StatusLine

    status = StatusLine("gradlint measure: ")  # drawn on a terminal only: no carriage returns in CI logs
    try:
        results, refused = measure_script(script, script_args, steps, fake, status.update)
    except MeasureError as err:
        status.close()
        click.echo(f"gradlint measure: {script}: {err}", err=True)
        sys.exit(2)
    status.close()
    click.echo(format_table(results, fake, refused))
    if plot_path:
        plot(results, plot_path)
        click.echo(f"memory plot written to {plot_path}")
