"""Render a `tune bench` comparison: terminal table, CI job-summary Markdown, JUnit XML, JSON."""

from __future__ import annotations

import json
import statistics
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.bench.gate import BenchOutcome, FigureRow
from tuner.bench.stats import Verdict

_MARK = {Verdict.OK: "ok", Verdict.REGRESSION: "REGRESSION", Verdict.IMPROVEMENT: "improved"}


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _change(row: FigureRow) -> str:
    c = row.comparison
    if c is None:
        return ""
    return f"{c.change_frac:+.1%} [{c.change_lo:+.1%}, {c.change_hi:+.1%}]"


def _verdict(row: FigureRow) -> str:
    return _MARK[row.comparison.verdict] if row.comparison else (row.note or "-")


def summary_line(outcome: BenchOutcome) -> str:
    if outcome.compared_with is None:
        return f"suite {outcome.suite.name}: measured, no baseline compared"
    n = len(outcome.regressions)
    if n == 0:
        return f"suite {outcome.suite.name}: no regression beyond {outcome.suite.tolerance:.0%}"
    names = ", ".join(f"{r.config}/{r.figure}" for r in outcome.regressions)
    return f"suite {outcome.suite.name}: {n} regression(s): {names}"


def print_table(outcome: BenchOutcome, console: Console) -> None:
    mode = outcome.suite.mode.value
    ref = f", reference {outcome.suite.reference}" if outcome.suite.reference else ""
    table = Table(title=f"tune bench {outcome.suite.name} ({mode} mode{ref})")
    for col in ("config", "figure", "median now", "change [95% CI]", "verdict"):
        table.add_column(col, justify="right" if col.startswith(("median", "change")) else "left")
    for row in outcome.rows or _measured_only(outcome):
        style = (
            "bold red" if row.comparison and row.comparison.verdict is Verdict.REGRESSION else None
        )
        table.add_row(
            row.config,
            row.figure,
            _fmt(row.current_median),
            _change(row),
            _verdict(row),
            style=style,
        )
    console.print(table)
    console.print(summary_line(outcome))


def _measured_only(outcome: BenchOutcome) -> list[FigureRow]:
    rows = []
    for name, cfg in outcome.baseline.configs.items():
        for fig, vals in cfg.samples.items():
            rows.append(FigureRow(name, fig, None, statistics.median(vals), "measured"))
    return rows


def markdown(outcome: BenchOutcome) -> str:
    env = outcome.baseline.environment
    lines = [
        f"## tune bench: {outcome.suite.name}",
        "",
        f"**{summary_line(outcome)}**",
        "",
        f"- mode: {env.mode}"
        + (f" (vs `{outcome.suite.reference}`)" if outcome.suite.reference else ""),
        f"- device: {env.device}; model: {env.model}; workload: {env.workload_hash}",
        f"- SLO: `{env.slo}` at {env.rate_rps:g} req/s; tolerance {outcome.suite.tolerance:.0%}",
        f"- baseline: {outcome.compared_with or 'none'}",
        "",
        "| config | figure | median now | change [95% CI] | verdict |",
        "|---|---|---:|---:|---|",
    ]
    for row in outcome.rows or _measured_only(outcome):
        verdict = _verdict(row)
        if verdict == "REGRESSION":
            verdict = "**REGRESSION**"
        cells = [row.config, row.figure, _fmt(row.current_median), _change(row), verdict]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def junit_xml(outcome: BenchOutcome) -> str:
    """One testcase per config and figure; a regression is a <failure>."""
    rows = outcome.rows or _measured_only(outcome)
    root = ET.Element("testsuites")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=f"tune-bench.{outcome.suite.name}",
        tests=str(len(rows)),
        failures=str(len(outcome.regressions)),
        errors="0",
    )
    for row in rows:
        case = ET.SubElement(suite, "testcase", classname=row.config, name=row.figure)
        c = row.comparison
        if c is not None and c.verdict is Verdict.REGRESSION:
            failure = ET.SubElement(
                case, "failure", message=f"{row.figure} {_change(row)} beyond {c.tolerance:.0%}"
            )
            failure.text = (
                f"baseline median {c.baseline_median:.6g}, now {c.current_median:.6g}; "
                f"worse by {c.worse_frac:.1%} (95% CI {c.worse_lo:.1%}..{c.worse_hi:.1%})"
            )
        elif c is None:
            ET.SubElement(case, "system-out").text = row.note
    return ET.tostring(root, encoding="unicode")


def as_json(outcome: BenchOutcome) -> dict[str, Any]:
    return {
        "suite": outcome.suite.name,
        "mode": outcome.suite.mode.value,
        "reference": outcome.suite.reference,
        "tolerance": outcome.suite.tolerance,
        "compared_with": outcome.compared_with,
        "regression": bool(outcome.regressions),
        "environment": asdict(outcome.baseline.environment),
        "configs": {k: asdict(v) for k, v in outcome.baseline.configs.items()},
        "rows": [
            {
                "config": r.config,
                "figure": r.figure,
                "current_median": r.current_median,
                "note": r.note,
                "comparison": None
                if r.comparison is None
                else {**asdict(r.comparison), "verdict": r.comparison.verdict.value},
            }
            for r in outcome.rows
        ],
    }


def write_text(path: str | Path, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def dumps(outcome: BenchOutcome) -> str:
    return json.dumps(as_json(outcome), indent=2)
