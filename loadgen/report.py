"""What the `loadgen` command prints and writes (the CLI layer: the one place loadgen uses slo)."""

from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass, field
from typing import Any

from loadgen.records import RequestRecord
from loadgen.runner import ReplayResult
from slo import SLO, RunMetrics, SLOReport, compute_metrics, evaluate, measured_latencies

_METRIC_NAMES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))


@dataclass(slots=True)
class RunInfo:
    """How the run was set up, echoed into the result with vLLM's key names where they exist."""

    backend: str
    model_id: str
    workload: str
    fingerprint: str
    arrival: str
    request_rate: float | None
    burstiness: float
    seed: int
    warmup: int
    workload_notes: list[str] = field(default_factory=list)


def build_result(info: RunInfo, res: ReplayResult, slo: SLO | None) -> dict[str, Any]:
    """One JSON-ready object: vllm bench serve's keys, then the SLO verdict, then ours."""
    report: SLOReport | None = evaluate(res.records, slo) if slo else None
    m = report.metrics if report else compute_metrics(res.records)
    out: dict[str, Any] = {
        "backend": info.backend,
        "model_id": info.model_id,
        "num_prompts": len(res.measured),
        "request_rate": info.request_rate if info.request_rate is not None else "trace",
        "burstiness": info.burstiness,
    }
    out.update(report.to_vllm_dict() if report else m.to_vllm_dict())
    if report is None:
        out["slo_met"] = None
    out.update(
        workload=info.workload,
        workload_fingerprint=info.fingerprint,
        workload_notes=info.workload_notes,
        arrival=info.arrival,
        seed=info.seed,
        warmup=info.warmup,
        error_rate=m.error_rate,
        failure_reasons=failure_reasons(res.records),
        mean_ttft_from_scheduled_ms=m.ttft_from_scheduled.mean_s * 1e3,
        p99_ttft_from_scheduled_ms=m.ttft_from_scheduled.p99_s * 1e3,
        p99_e2el_from_scheduled_ms=m.e2el_from_scheduled.p99_s * 1e3,
        schedule_ok=res.schedule_ok,
        schedule_notes=res.notes,
        p99_send_lag_ms=res.p99_send_lag_s * 1e3,
        max_loop_lag_ms=res.max_loop_lag_s * 1e3,
        workers=res.workers,
        per_class=_per_class(m, report),
    )
    return json_safe(out)


def failure_reasons(records: list[RequestRecord], top: int = 5) -> dict[str, int]:
    """Most common failure reasons among measured requests (numbers stripped to group them)."""
    counts = collections.Counter(
        _reason_key(r.error) for r in records if not r.warmup and not r.success
    )
    return dict(counts.most_common(top))


def record_rows(records: list[RequestRecord]) -> list[dict[str, Any]]:
    """Per-request derived values (ms) to store beside the raw records."""
    rows = []
    for lat in measured_latencies(records):
        rows.append(
            {
                "index": lat.index,
                "ttft_ms": lat.ttft_s * 1e3,
                "tpot_ms": None if lat.tpot_s is None else lat.tpot_s * 1e3,
                "e2el_ms": lat.e2el_s * 1e3,
                "max_itl_ms": lat.max_itl_s * 1e3 if lat.ok else math.nan,
                "ttft_from_scheduled_ms": lat.ttft_from_scheduled_s * 1e3,
                "send_lag_ms": lat.send_lag_s * 1e3,
            }
        )
    return rows


def json_safe(obj: Any) -> Any:
    """NaN and infinities become null: JSON has no spelling for them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def print_tables(result: dict[str, Any], console: Any) -> None:
    """The human-readable summary of `build_result`'s object."""
    from rich.table import Table

    head = Table(title="loadgen result", show_header=False, title_justify="left")
    for key, label in (
        ("backend", "target"),
        ("workload", "workload"),
        ("request_rate", "request rate (req/s)"),
        ("completed", "successful requests"),
        ("failed", "failed requests"),
        ("duration", "duration (s)"),
        ("request_throughput", "request throughput (req/s)"),
        ("request_goodput", "request goodput (req/s)"),
        ("output_throughput", "output token throughput (tok/s)"),
        ("total_token_throughput", "total token throughput (tok/s)"),
        ("p99_ttft_from_scheduled_ms", "P99 TTFT from scheduled arrival (ms)"),
    ):
        head.add_row(label, _fmt(result.get(key)))
    console.print(head)
    lat = Table(title="latency (ms)", title_justify="left")
    for col in ("metric", "mean", "median", "p90", "p99", "p99.9"):
        lat.add_column(col, justify="right")
    for key, name in _METRIC_NAMES:
        stats = ("mean", "median", "p90", "p99", "p99.9")
        lat.add_row(name, *(_fmt(result.get(f"{s}_{key}_ms")) for s in stats))
    console.print(lat)
    _print_classes(result, console)
    _print_slo(result, console)
    for note in result["schedule_notes"]:
        console.print(f"[bold yellow]warning:[/] {note}")
    for reason, count in result["failure_reasons"].items():
        console.print(f"[red]{count} failed:[/] {reason}")


def _print_classes(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title="per class (ms)", title_justify="left")
    for col in ("class", "requests", "failed", "p99 TTFT", "p99 TPOT", "p99 ITL", "attainment"):
        table.add_column(col, justify="right")
    for name, c in result["per_class"].items():
        table.add_row(
            name,
            str(c["requests"]),
            str(c["failed"]),
            _fmt(c["p99_ttft_ms"]),
            _fmt(c["p99_tpot_ms"]),
            _fmt(c["p99_itl_ms"]),
            _fmt(c.get("slo_attainment")),
        )
    console.print(table)


def _print_slo(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    if result.get("slo_met") is None:
        return
    verdict = "[green]met[/]" if result["slo_met"] else "[red]not met[/]"
    table = Table(title=f"SLO {result['slo']}: {verdict}", title_justify="left")
    for col in ("term", "limit (ms)", "value (ms)", "margin"):
        table.add_column(col, justify="right")
    for t in result["slo_terms"]:
        margin = "-" if t["margin"] is None else f"{t['margin']:+.1%}"
        table.add_row(t["term"], _fmt(t["limit_ms"]), _fmt(t["value_ms"]), margin)
    console.print(table)
    console.print(
        f"attainment {_fmt(result['slo_attainment'])}, binding {result['slo_binding_term']}"
    )


def _per_class(m: RunMetrics, report: SLOReport | None) -> dict[str, Any]:
    out = {}
    for name, c in m.per_class.items():
        row: dict[str, Any] = {"requests": c.requests, "completed": c.completed, "failed": c.failed}
        for key, _ in _METRIC_NAMES:
            s = getattr(c, key)
            row[f"mean_{key}_ms"], row[f"p99_{key}_ms"] = s.mean_s * 1e3, s.p99_s * 1e3
        if report is not None:
            row["slo_attainment"] = report.class_attainment.get(name)
            row["slo_terms"] = {r.term.name: r.value_s * 1e3 for r in report.class_terms[name]}
        out[name] = row
    return out


def _reason_key(error: str | None) -> str:
    # "stream cut after 3 chunks" and "... after 7 chunks" are one reason.
    return re.sub(r"\b\d+ chunks\b", "N chunks", error or "unknown")[:160]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1e6 else f"{value:.3g}"
    return str(value)
