"""Click commands of the runtime: ``gradlint run`` and ``gradlint measure``.

This module imports no torch; the commands import it when they run, so the
main CLI can register them without slowing the static linter down.

Arguments for the script go after ``--`` and only there: ``gradlint run
train.py --steps 3 -- --lr 0.1`` runs 3 steps of ``train.py --lr 0.1``. An
option before ``--`` that gradlint does not know is an error, never passed on.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

EXIT_CLEAN, EXIT_CONFIRMED, EXIT_ERROR = 0, 1, 2


class _ScriptCommand(click.Command):
    """A command whose arguments after the first ``--`` are the script's own, kept verbatim."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            args, ctx.meta["script_args"] = args[:cut], tuple(args[cut + 1 :])
        else:
            ctx.meta["script_args"] = ()
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as err:
            raise click.UsageError(
                f"no such option: {err.option_name} (arguments for the script go after '--': "
                f"gradlint {self.name} SCRIPT [OPTIONS] -- ARGS)",
                ctx,
            ) from err


def _script_args() -> tuple[str, ...]:
    return click.get_current_context().meta["script_args"]


def _require_torch(command: str) -> None:
    """Stop with one clear line when torch (the runtime extra) is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        click.echo(f"gradlint {command}: needs torch: pip install torch, then pip install 'gradlint[runtime]'", err=True)
        sys.exit(EXIT_ERROR)


@click.command("run", cls=_ScriptCommand)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Optimizer steps to run.")
def run_command(script: str, steps: int) -> None:
    """Run SCRIPT for a few optimizer steps and confirm or refute its static findings.

    Arguments after ``--`` go to the script. Exit 1 when a finding is confirmed,
    0 otherwise, 2 when the script could not be judged. Under torchrun every
    rank runs and rank 0 prints one report, merged from all ranks.
    """
    _require_torch("run")
    from gradlint.runtime.ranks import rank_and_world
    from gradlint.runtime.run import RunError, format_report, run_and_judge, static_findings

    payload: dict[str, Any]
    try:
        findings = static_findings(script)
        if findings is None:
            click.echo("note: the static linter (gradlint.linter) is not installed; showing the trace only", err=True)
            findings = []
        report = run_and_judge(script, findings, _script_args(), steps)
    except RunError as err:
        payload = {"error": f"gradlint run: {script}: {err}", "detail": _failure_detail(err), "code": EXIT_ERROR}
    else:
        code = EXIT_CONFIRMED if report.confirmed else EXIT_CLEAN
        payload = {"report": format_report(report), "code": code, "verdicts": _verdict_rows(report)}
    ranks = rank_and_world()
    if ranks is None:
        _print_payload(payload)
        sys.exit(payload["code"])
    _report_from_rank_0(payload, *ranks)


def _failure_detail(err: Any) -> str:
    from gradlint.runtime.run import format_events

    parts = []
    if err.traceback:
        parts.append(err.traceback)
    if err.events:
        parts.append("events seen before the failure:")
        parts.extend(format_events(err.events, max_steps=10**9))
    else:
        parts.append("no events were seen before the failure")
    return "\n".join(parts)


def _verdict_rows(report: Any) -> list[list[Any]]:
    return [[v.finding.line, v.finding.code, v.status, v.evidence] for v in report.verdicts]


def _print_payload(payload: dict[str, Any]) -> None:
    if "error" in payload:
        click.echo(payload["detail"], err=True)
        click.echo(payload["error"], err=True)
    else:
        click.echo(payload["report"])


def _report_from_rank_0(payload: dict[str, Any], rank: int, world: int) -> None:
    """Every rank hands its result over; rank 0 prints them merged and exits with the merged status."""
    from gradlint.runtime.ranks import exchange

    payload["rank"] = rank
    gathered = exchange(payload, rank, world)
    if gathered is None:
        sys.exit(EXIT_CLEAN)  # rank 0 speaks for this rank
    failed = [p for p in gathered if "error" in p or p.get("missing")]
    for p in failed:
        if p.get("missing"):
            click.echo(f"gradlint run: rank {p['rank']} sent no report", err=True)
        else:
            click.echo(f"[rank {p['rank']}]\n{p['detail']}", err=True)
            click.echo(f"{p['error']} (rank {p['rank']})", err=True)
    reports = [p for p in gathered if "report" in p]
    if reports:
        click.echo(reports[0]["report"])
        click.echo(_merged_verdicts(reports, world))
    sys.exit(EXIT_ERROR if failed else max(p["code"] for p in reports))


def _merged_verdicts(reports: list[dict[str, Any]], world: int) -> str:
    """One line per finding over all ranks: confirmed where any rank confirmed it."""
    lines = [f"merged over {world} ranks (the report above is rank {reports[0]['rank']}'s):"]
    for i, (line, code, status, evidence) in enumerate(reports[0]["verdicts"]):
        per_rank = [(p["rank"], p["verdicts"][i]) for p in reports if i < len(p["verdicts"])]
        confirming = [r for r, v in per_rank if v[2] == "confirmed"]
        statuses = sorted({v[2] for _, v in per_rank})
        if confirming:
            text = f"confirmed on rank{'s' if len(confirming) > 1 else ''} {', '.join(map(str, confirming))}"
        elif len(statuses) == 1:
            text = f"{statuses[0]} on every rank"
        else:
            text = "; ".join(f"rank {r}: {v[2]}" for r, v in per_rank)
        lines.append(f"  line {line}: {code} {text}")
    if not reports[0]["verdicts"]:
        lines.append("  static findings: none")
    return "\n".join(lines)


@click.command("measure", cls=_ScriptCommand)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=2), help="Optimizer steps per mode.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG of memory over one step.")
@click.option("--fake", is_flag=True, help="Estimate on fake tensors: nothing is allocated.")
@click.option("--time-steps", default=12, show_default=True, type=click.IntRange(min=3),
              help="Steps of the separate, unmetered run that times each mode.")
@click.option("--cuda-snapshot", is_flag=True,
              help="On CUDA, write the allocator's memory history of each mode next to the --plot file.")
def measure_command(
    script: str, steps: int, plot_path: str | None, fake: bool, time_steps: int, cuda_snapshot: bool
) -> None:
    """Measure SCRIPT as written, with set_to_none=True, with gradient release and with fused=True.

    Each run is a process of its own. Prints peak memory with its split,
    median step time and the largest parameter difference from the
    as-written run, judged in words. Gradient release is the script's GL204
    rewrite where --fix can write one; fused=True is measured where an
    optimizer has a fused kernel it does not use. Arguments after ``--`` go
    to the script. Exit 2 when a mode could not be measured. Under torchrun
    every rank measures and rank 0 prints its table with every rank's peaks.
    """
    _require_torch("measure")
    from gradlint.runtime.measure import MeasureError, format_table, measure_script, plot

    from gradlint.progress import StatusLine

    status = StatusLine("gradlint measure: ")  # drawn on a terminal only: no carriage returns in CI logs
    payload: dict[str, Any]
    results = []
    try:
        prefix = None
        if cuda_snapshot:
            if not plot_path:
                raise click.UsageError("--cuda-snapshot writes next to the plot: give --plot FILE too")
            prefix = os.path.splitext(plot_path)[0]
        results, refused = measure_script(script, _script_args(), steps, fake, status.update, time_steps, prefix)
    except MeasureError as err:
        payload = {"error": f"gradlint measure: {script}: {err}", "detail": err.traceback, "code": EXIT_ERROR}
    else:
        payload = {"report": format_table(results, fake, refused), "code": EXIT_CLEAN,
                   "peaks": [[r.mode, r.memory.peak] for r in results]}
    finally:
        status.close()
    from gradlint.runtime.ranks import rank_and_world

    ranks = rank_and_world()
    if ranks is not None:
        payload = _merged_measure(payload, *ranks)
        if payload is None:
            sys.exit(EXIT_CLEAN)  # rank 0 speaks for this rank
    if "error" in payload:
        if payload["detail"]:
            click.echo(payload["detail"], err=True)
        click.echo(payload["error"], err=True)
        sys.exit(EXIT_ERROR)
    click.echo(payload["report"])
    if plot_path:
        plot(results, plot_path)
        click.echo(f"memory plot written to {plot_path}")


def _merged_measure(payload: dict[str, Any], rank: int, world: int) -> dict[str, Any] | None:
    """Under torchrun: every rank hands its result to rank 0, which gets one payload to print (``None`` elsewhere).

    Each rank measured its own replica of the loop; their peaks can differ by
    a few bytes (what the all-reduces allocate, and when). Rank 0 shows its own
    table and, per mode, the largest peak and every rank's; any rank that could
    not be measured makes the whole an error, with that rank's message.
    """
    from gradlint.runtime.measure import human_bytes
    from gradlint.runtime.ranks import exchange

    payload["rank"] = rank
    gathered = exchange(payload, rank, world)
    if gathered is None:
        return None
    failed = [p for p in gathered if "error" in p or p.get("missing")]
    if failed:
        details = [f"[rank {p['rank']}]\n{p['detail']}" for p in failed if p.get("detail")]
        errors = [f"gradlint measure: rank {p['rank']} sent no result" if p.get("missing") else f"{p['error']} (rank {p['rank']})"
                  for p in failed]
        return {"error": "\n".join(errors), "detail": "\n".join(details), "code": EXIT_ERROR}
    lines = [f"merged over {world} ranks (the table above is rank {rank}'s):"]
    for i, (mode, _) in enumerate(payload["peaks"]):
        peaks = [(p["rank"], p["peaks"][i][1]) for p in gathered if i < len(p["peaks"]) and p["peaks"][i][0] == mode]
        absent = [p["rank"] for p in gathered if not (i < len(p["peaks"]) and p["peaks"][i][0] == mode)]
        top_rank, top = max(peaks, key=lambda rank_peak: rank_peak[1])  # the first of equal ones
        text = f"largest peak {human_bytes(top)} on rank {top_rank}; " + ", ".join(
            f"rank {r} {human_bytes(peak)}" for r, peak in peaks
        )
        if absent:
            text += f"; not measured on rank{'s' if len(absent) > 1 else ''} " + ", ".join(map(str, absent))
        lines.append(f"  {mode}: {text}")
    return {**payload, "report": payload["report"] + "\n" + "\n".join(lines)}
