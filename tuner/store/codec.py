"""JSON forms of the typed records, both ways: the one place a record becomes JSON. One shape
per SLO term (`term_json`); seconds in records, milliseconds in reports; NaN and inf become
null, and null reads back as inf (a latency nothing achieved)."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slo import SLO
from tuner.measure.meter import LatencyFigures, LevelRecord
from tuner.measure.verdict import Interval, LevelVerdict, TermVerdict, VerdictRules
from tuner.store.records import Candidate, Confirmation, Role, SameRateCheck
from tuner.targets.base import ServerStats
from tuner.targets.knobs import knobs_from_json, knobs_to_json

_SERVER = tuple(f.name for f in dataclasses.fields(ServerStats))


def clean_json(value: Any) -> Any:
    """JSON-safe copy: NaN and inf become null, enums their value, paths strings."""
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return value.value
    return str(value) if isinstance(value, Path) else value


def _inf(value: float | None, scale: float = 1.0) -> float:
    return math.inf if value is None else value * scale


def term_json(t: TermVerdict) -> dict[str, Any]:
    """`term` is the whole term (`tpot_p99=30ms`), `metric` its left-hand side."""
    low, high = (t.interval_s.low, t.interval_s.high) if t.interval_s else (None, None)
    return clean_json({
        "term": str(t.term), "metric": t.name, "limit_ms": t.limit_s * 1e3,
        "value_ms": t.value_s * 1e3, "low_ms": low and low * 1e3, "high_ms": high and high * 1e3,
        "margin": t.margin_frac, "clears": t.clears,
    })  # fmt: skip


def term_from_json(data: Mapping[str, Any], slo: SLO) -> TermVerdict:
    term = next(t for t in slo.terms if t.name == data["metric"])
    value = _inf(data["value_ms"], 1e-3)
    if data.get("low_ms") is None and data.get("high_ms") is None:
        return TermVerdict(term, value)
    low, high = _inf(data.get("low_ms"), 1e-3), _inf(data.get("high_ms"), 1e-3)
    return TermVerdict(term, value, Interval(value, low, high))


def interval_json(interval: Interval | None) -> dict[str, Any] | None:
    return None if interval is None else clean_json(dataclasses.asdict(interval))


def interval_from_json(data: Mapping[str, Any] | None) -> Interval | None:
    return None if data is None else Interval(*(_inf(data[k]) for k in ("point", "low", "high")))


def level_row(level: LevelRecord) -> dict[str, Any]:
    """Flat figures of one level (no per-request records)."""
    v, binding = level.verdict, level.verdict.binding
    row: dict[str, Any] = {
        "rate_rps": v.rate_rps, "passed": v.passed, "slo_met": v.slo_met,
        "error_rate": v.error_rate, "served_fraction": v.served_fraction,
        "schedule_ok": v.schedule_ok, "binding": binding.name if binding else None,
        "goodput_rps": level.goodput_rps, "request_throughput_rps": level.request_throughput_rps,
        "wall_s": level.wall_s, "max_loop_lag_s": level.max_loop_lag_s,
        "foreign_cpu_cores": level.foreign_cpu_cores, "steal_share": level.steal_share,
        "tries": level.tries, "step_pace": level.step_pace, "stopped_s": level.stopped_s,
        **level.latency.as_dict(),
    }  # fmt: skip
    for t in v.terms:
        row[f"slo_{t.name}_s"], row[f"slo_{t.name}_margin"] = t.value_s, t.margin_frac
    row["binding_margin"] = binding.margin_frac if binding else None
    return clean_json({**row, **dataclasses.asdict(level.server)})


def level_from_row(row: Mapping[str, Any], slo: SLO, rules: VerdictRules) -> LevelRecord:
    def number(key: str) -> float:
        return math.nan if row.get(key) is None else float(row[key])

    terms = tuple(TermVerdict(t, _inf(row.get(f"slo_{t.name}_s"))) for t in slo.terms)
    verdict = LevelVerdict(float(row["rate_rps"]), terms, number("error_rate"),
                           number("served_fraction"), bool(row.get("schedule_ok", True)),
                           rules)  # fmt: skip
    latency = LatencyFigures(**{k: number(k) for k in LatencyFigures().as_dict()})
    server = ServerStats(*(row.get(k) for k in _SERVER))
    watched = {k: None if row.get(k) is None else float(row[k])
               for k in ("foreign_cpu_cores", "steal_share", "step_pace", "stopped_s")}  # fmt: skip
    return LevelRecord(verdict, number("goodput_rps"), number("request_throughput_rps"), latency,
                       number("wall_s") or 0.0, number("max_loop_lag_s"), server, **watched,
                       tries=int(row.get("tries") or 1))  # fmt: skip


def verdict_json(v: LevelVerdict) -> dict[str, Any]:
    """The shape every confirmed figure shares (candidates, both sides of the same-rate check)."""
    return {"served_fraction": v.served_fraction, "error_rate": v.error_rate,
            "schedule_ok": v.schedule_ok, "terms": [term_json(t) for t in v.terms]}  # fmt: skip


def verdict_from_json(
    data: Mapping[str, Any], rate_rps: float, slo: SLO, rules: VerdictRules
) -> LevelVerdict:
    terms = tuple(term_from_json(t, slo) for t in data["terms"])
    return LevelVerdict(rate_rps, terms, data["error_rate"], data["served_fraction"],
                        data.get("schedule_ok", True), rules)  # fmt: skip


def candidate_json(c: Candidate) -> dict[str, Any]:
    return clean_json({
        "trial": c.trial, "role": c.role, "config": knobs_to_json(c.knobs),
        "value": c.search_value, "rate_rps": c.verdict.rate_rps, "repeats": c.repeats,
        "confirmed_rps": c.confirmed_rps, "clears": c.clears,
        "capacity_ci": interval_json(c.capacity_ci), "goodput_ci": interval_json(c.goodput_ci),
        **verdict_json(c.verdict),
    })  # fmt: skip


def candidate_from_json(data: Mapping[str, Any], slo: SLO, rules: VerdictRules) -> Candidate:
    return Candidate(
        trial=data["trial"], role=Role(data["role"]), knobs=knobs_from_json(data["config"]),
        search_value=data["value"],
        verdict=verdict_from_json(data, data["rate_rps"], slo, rules), repeats=data["repeats"],
        confirmed_rps=data["confirmed_rps"],
        capacity_ci=interval_from_json(data.get("capacity_ci")),
        goodput_ci=interval_from_json(data.get("goodput_ci")),
    )  # fmt: skip


def same_rate_json(s: SameRateCheck | None) -> dict[str, Any] | None:
    if s is None:
        return None
    d, r = s.default, s.recommended
    return clean_json({
        "rate_rps": s.rate_rps,
        "default": {"meets_slo": d.passed, "slo_met": d.slo_met, "kept_up": d.kept_up,
                    "draws": s.default_draws, "draws_missed": s.default_draws_missed,
                    "draws_stopped": s.default_draws_stopped,
                    **verdict_json(d)},
        "recommended": {"meets_slo": r.clears, "repeats": s.recommended_repeats,
                        **verdict_json(r)},
    })  # fmt: skip


def confirmation_json(c: Confirmation) -> dict[str, Any]:
    return clean_json({
        "candidates": [candidate_json(x) for x in c.candidates], "chosen_trial": c.chosen_trial,
        "default_at_recommended_rate": same_rate_json(c.same_rate), "stopped_by": c.stopped_by,
        "elapsed_s": c.elapsed_s, "phases_s": c.phases_s,
    })  # fmt: skip


def confirmation_from_json(data: Mapping[str, Any], slo: SLO, rules: VerdictRules) -> Confirmation:
    same, check = data.get("default_at_recommended_rate"), None
    if same:
        rate = same["rate_rps"]
        check = SameRateCheck(rate, verdict_from_json(same["default"], rate, slo, rules),
                              verdict_from_json(same["recommended"], rate, slo, rules),
                              same["recommended"]["repeats"],
                              same["default"].get("draws", 1),
                              same["default"].get("draws_missed"),
                              same["default"].get("draws_stopped", 0))  # fmt: skip
    return Confirmation([candidate_from_json(x, slo, rules) for x in data.get("candidates", [])],
                        data.get("chosen_trial"), check, data.get("stopped_by") or "",
                        data.get("elapsed_s"), dict(data.get("phases_s") or {}))  # fmt: skip
