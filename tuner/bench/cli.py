"""`tune bench` command line (exit 0 no regression, 1 regression, 2 could not run), and its
outputs: the terminal table, a CI job-summary in Markdown, JUnit XML and JSON."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.bench.baseline import load_baseline, write_baseline
from tuner.bench.gate import (
    BenchOutcome,
    FigureRow,
    compare,
    environment_problem,
    measure_suite,
)
from tuner.bench.stats import Comparison, Verdict, parse_tolerance
from tuner.bench.suite import BenchMode, BenchSuite, load_suite
from tuner.errors import TuneError
from tuner.targets.signals import Stopped, run_stoppable

EXIT_OK, EXIT_REGRESSION, EXIT_CANNOT_RUN = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tune bench",
        description="Replay a fixed workload against fixed configs and fail on a regression.",
    )
    p.add_argument("--suite", required=True, help="suite TOML (see results/baselines/*.toml)")
    p.add_argument("--baseline", required=True, help="baseline JSON to compare with or write")
    p.add_argument("--tolerance", help="allowed worsening, e.g. 5%% (default: the suite's)")
    p.add_argument("--update-baseline", action="store_true", help="write this run as the baseline")
    p.add_argument("--repeats", type=int, help="measurements per config (default: the suite's)")
    p.add_argument("--mode", choices=[m.value for m in BenchMode], help="override the suite's mode")
    p.add_argument(
        "--noise-floor", default="0%", help="widen every interval by this much, e.g. 3%%"
    )
    p.add_argument("--url", help="measure a running server instead of the suite's target")
    p.add_argument("--launch", help="start this server command per config (knob placeholders)")
    p.add_argument(
        "--report-only", action="store_true", help="print verdicts but exit 0 on regression"
    )
    p.add_argument("--markdown", metavar="PATH", help="write a CI job summary (Markdown)")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML (one testcase per figure)")
    p.add_argument("--json", action="store_true", help="print the raw result as JSON on stdout")
    return p


def _load(args: argparse.Namespace) -> BenchSuite:
    suite = load_suite(args.suite)
    if args.mode is not None:
        suite.set_mode(BenchMode(args.mode))
    if suite.mode is BenchMode.SIM:
        _refuse_in_sim(args)
    if args.tolerance is not None:
        suite.tolerance = parse_tolerance(args.tolerance)
    if args.repeats is not None:
        if args.repeats < 1:
            raise TuneError(f"--repeats {args.repeats} must be at least 1 (3-5 is typical)")
        suite.repeats = args.repeats
    if args.url and args.launch:
        raise TuneError("give --url or --launch, not both")
    served = suite.target.get("model", "tiny")
    if args.url:
        suite.target = {"url": args.url, "served_model_name": served}
    if args.launch:
        suite.target = {"launch": args.launch, "served_model_name": served}
    return suite


def _refuse_in_sim(args: argparse.Namespace) -> None:
    """Flags about noise or a real server mean nothing to one exact run in virtual time."""
    given = [flag for flag, value in (("--tolerance", args.tolerance), ("--repeats", args.repeats),
             ("--url", args.url), ("--launch", args.launch)) if value is not None]  # fmt: skip
    if parse_tolerance(args.noise_floor) > 0:
        given.append("--noise-floor")
    if given:
        raise TuneError(f"sim mode has no {', '.join(given)} (one run in virtual time, compared "
                        "exactly); drop it")  # fmt: skip


def run(args: argparse.Namespace, console: Console) -> int:
    suite = _load(args)
    noise = parse_tolerance(args.noise_floor)
    baseline = None
    if not args.update_baseline:
        baseline = load_baseline(args.baseline)  # fail before measuring for minutes
    with console.status(f"measuring suite {suite.name}") as status:
        measured = run_stoppable(measure_suite(suite, progress=lambda s: status.update(s)))
    outcome = BenchOutcome(suite=suite, baseline=measured)
    problem = baseline and environment_problem(measured, baseline)
    if problem and args.report_only:
        # CI machines differ from run to run: report-only prints what it measured, never fails.
        outcome.not_compared = problem
    elif baseline is not None:
        outcome.rows = compare(measured, baseline, suite, noise_floor=noise)
        outcome.compared_with = str(args.baseline)
    if args.update_baseline:
        write_baseline(measured, args.baseline)
        console.print(f"wrote baseline {args.baseline}")
    print_table(outcome, console)
    if args.markdown:
        write_text(args.markdown, markdown(outcome))
    if args.junit:
        write_text(args.junit, junit_xml(outcome))
    if args.json:
        sys.stdout.write(dumps(outcome) + "\n")
    if outcome.regressions and not args.report_only:
        return EXIT_REGRESSION
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # With --json, stdout carries only the JSON; the table goes to stderr.
    console = Console(stderr=bool(args.json))
    try:
        return run(args, console)
    except ValueError as exc:  # TuneError, and the other packages' user errors (SLO, workload)
        console.print(f"error: {exc}", markup=False, highlight=False)
        return EXIT_CANNOT_RUN
    except KeyboardInterrupt:
        console.print("interrupted; nothing was compared", markup=False, highlight=False)
        return 130
    except Stopped as stop:
        console.print(f"stopped by {stop}; nothing was compared", markup=False, highlight=False)
        return stop.exit_code


_MARK = {Verdict.OK: "ok", Verdict.REGRESSION: "REGRESSION", Verdict.IMPROVEMENT: "improved"}
_COLUMNS = ("config", "figure", "median now", "change [95% CI]", "verdict")


def _change(c: Comparison | None) -> str:
    """The change with its interval; an exact one (sim mode) to 3 digits, however small."""
    if c is None:
        return ""
    if c.change_lo == c.change_hi or math.isnan(c.change_frac):  # nan: a figure now missing
        return f"{c.change_frac * 100:+.3g}%"
    return f"{c.change_frac:+.1%} [{c.change_lo:+.1%}, {c.change_hi:+.1%}]"


def _cells(row: FigureRow) -> list[str]:
    """One row of the table: config, figure, median now, change with its interval, verdict."""
    value, c = row.current_median, row.comparison
    median = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    change = _change(c)
    verdict = _MARK[c.verdict] if c else (row.note or "-")
    return [row.config, row.figure, median, change, verdict]


def _is_regression(row: FigureRow) -> bool:
    return row.comparison is not None and row.comparison.verdict is Verdict.REGRESSION


def _rows(outcome: BenchOutcome) -> list[FigureRow]:
    """The comparison, or without a baseline each figure as measured."""
    return outcome.rows or [
        FigureRow(name, fig, None, statistics.median(vals), "measured")
        for name, cfg in outcome.baseline.configs.items()
        for fig, vals in cfg.samples.items()
    ]


def _allowed(suite: BenchSuite) -> str:
    exact = suite.mode is BenchMode.SIM
    return "exact, in virtual time" if exact else f"tolerance {suite.tolerance:.0%}"


def summary_line(outcome: BenchOutcome) -> str:
    name = outcome.suite.name
    if outcome.not_compared:
        return f"suite {name}: measured, not compared: {outcome.not_compared}"
    if outcome.compared_with is None:
        return f"suite {name}: measured, no baseline compared"
    exact = outcome.suite.mode is BenchMode.SIM
    beyond = "(exact, in virtual time)" if exact else f"beyond {outcome.suite.tolerance:.0%}"
    if not outcome.regressions:
        line = f"suite {name}: no regression {beyond}"
    else:
        names = ", ".join(f"{r.config}/{r.figure}" for r in outcome.regressions)
        line = f"suite {name}: {len(outcome.regressions)} regression(s): {names}"
    if exact and outcome.improvements:  # an exact baseline that is out of date says so
        better = outcome.improvements
        names = ", ".join(f"{r.config}/{r.figure}" for r in better)
        line += f"; {len(better)} improved ({names}): re-record with --update-baseline"
    return line


def print_table(outcome: BenchOutcome, console: Console) -> None:
    suite = outcome.suite
    ref = f", reference {suite.reference}" if suite.reference else ""
    table = Table(title=f"tune bench {suite.name} ({suite.mode.value} mode{ref})")
    for col in _COLUMNS:
        table.add_column(col, justify="right" if col.startswith(("median", "change")) else "left")
    for row in _rows(outcome):
        table.add_row(*_cells(row), style="bold red" if _is_regression(row) else None)
    console.print(table)
    console.print(summary_line(outcome))


def markdown(outcome: BenchOutcome) -> str:
    env, suite = outcome.baseline.environment, outcome.suite
    versus = f" (vs `{suite.reference}`)" if suite.reference else ""
    lines = [f"## tune bench: {suite.name}", "", f"**{summary_line(outcome)}**", "",
             f"- mode: {env.mode}{versus}",
             f"- device: {env.device}; model: {env.model}; workload: {env.workload_hash}"
             + (f"; profile: {env.profile} ({env.profile_hash})" if env.profile else ""),
             f"- SLO: `{env.slo}` at {env.rate_rps:g} req/s; {_allowed(suite)}",
             f"- baseline: {outcome.compared_with or 'none'}", "",
             "| " + " | ".join(_COLUMNS) + " |", "|---|---|---:|---:|---|"]  # fmt: skip
    for row in _rows(outcome):
        cells = _cells(row)
        if _is_regression(row):
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def junit_xml(outcome: BenchOutcome) -> str:
    """One testcase per config and figure; a regression is a <failure>."""
    rows = _rows(outcome)
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name=f"tune-bench.{outcome.suite.name}",
                          tests=str(len(rows)), failures=str(len(outcome.regressions)),
                          errors="0")  # fmt: skip
    for row in rows:
        case = ET.SubElement(suite, "testcase", classname=row.config, name=row.figure)
        c = row.comparison
        if c is None:
            ET.SubElement(case, "system-out").text = row.note
        elif c.verdict is Verdict.REGRESSION:
            message = f"{row.figure} {_cells(row)[3]} beyond {c.tolerance:.0%}"
            ET.SubElement(case, "failure", message=message).text = (
                f"baseline median {c.baseline_median:.6g}, now {c.current_median:.6g}; "
                f"worse by {c.worse_frac:.1%} (95% CI {c.worse_lo:.1%}..{c.worse_hi:.1%})"
            )
    return ET.tostring(root, encoding="unicode")


def as_json(outcome: BenchOutcome) -> dict[str, Any]:
    suite = outcome.suite

    def row(r: FigureRow) -> dict[str, Any]:
        c = (
            None
            if r.comparison is None
            else {**asdict(r.comparison), "verdict": r.comparison.verdict.value}
        )
        return {"config": r.config, "figure": r.figure, "current_median": r.current_median,
                "note": r.note, "comparison": c}  # fmt: skip

    return {"suite": suite.name, "mode": suite.mode.value, "reference": suite.reference,
            "tolerance": suite.allowed_change, "compared_with": outcome.compared_with,
            "regression": bool(outcome.regressions),
            "environment": asdict(outcome.baseline.environment),
            "configs": {k: asdict(v) for k, v in outcome.baseline.configs.items()},
            "rows": [row(r) for r in outcome.rows]}  # fmt: skip


def write_text(path: str | Path, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def dumps(outcome: BenchOutcome) -> str:
    return json.dumps(as_json(outcome), indent=2)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
