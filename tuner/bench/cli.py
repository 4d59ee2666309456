"""`tune bench` command line: exit 0 no regression, 1 regression, 2 could not run."""

from __future__ import annotations

import argparse
import asyncio
import sys

from rich.console import Console

from tuner.bench.baseline import load_baseline, write_baseline
from tuner.bench.gate import BenchOutcome, compare, measure_suite
from tuner.bench.report import dumps, junit_xml, markdown, print_table, write_text
from tuner.bench.stats import parse_tolerance
from tuner.bench.suite import BenchMode, load_suite
from tuner.errors import TuneError

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


def _load(args: argparse.Namespace):
    suite = load_suite(args.suite)
    if args.tolerance is not None:
        suite.tolerance = parse_tolerance(args.tolerance)
    if args.repeats is not None:
        if args.repeats < 1:
            raise TuneError(f"--repeats {args.repeats} must be at least 1 (3-5 is typical)")
        suite.repeats = args.repeats
    if args.mode is not None:
        suite.mode = BenchMode(args.mode)
        suite.reference = suite.reference or suite.configs[0].name
    if args.url and args.launch:
        raise TuneError("give --url or --launch, not both")
    if args.url:
        suite.target = {"url": args.url, "served_model_name": suite.target.get("model", "tiny")}
    if args.launch:
        suite.target = {
            "launch": args.launch,
            "served_model_name": suite.target.get("model", "tiny"),
        }
    return suite


def run(args: argparse.Namespace, console: Console) -> int:
    suite = _load(args)
    noise = parse_tolerance(args.noise_floor)
    baseline = None
    if not args.update_baseline:
        baseline = load_baseline(args.baseline)  # fail before measuring for minutes
    with console.status(f"measuring suite {suite.name}") as status:
        measured = asyncio.run(measure_suite(suite, progress=lambda s: status.update(s)))
    outcome = BenchOutcome(suite=suite, baseline=measured)
    if baseline is not None:
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
    except TuneError as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        return EXIT_CANNOT_RUN
    except ValueError as exc:  # the other packages' user errors (bad SLO, bad workload, bad knob)
        console.print(f"error: {exc}", markup=False, highlight=False)
        return EXIT_CANNOT_RUN


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
