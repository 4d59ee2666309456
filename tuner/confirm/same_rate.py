"""The vLLM default measured at the recommended config's rate: does the SLO actually bind?

"1.1x the default's capacity" is a ratio of two rate searches. The plainer question a serving
engineer asks is: at the traffic the recommendation is rated for, would the default have met the
SLO? One more level of the same seeded request list, on the default config, at the recommended
config's confirmed rate, answers it side by side with the recommendation's own figures there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen import RequestSpec
from slo import SLO
from tuner.confirm.candidates import Candidate, term_dict
from tuner.measure.bootstrap import term_intervals
from tuner.measure.level import LevelSettings, measure_level
from tuner.store.runfiles import RunFiles
from tuner.targets.base import Target

RECORDS_FILE = "records_default_at_recommended_rate.jsonl"


async def default_at_rate(
    target: Target,
    requests: Sequence[RequestSpec],
    slo: SLO,
    settings: LevelSettings,
    files: RunFiles,
    default_knobs: dict[str, Any],
    chosen: Candidate,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure the default once at `chosen.rate_rps`; both configs' terms at that rate."""
    await target.apply(default_knobs)
    level = await measure_level(target, requests, chosen.rate_rps, slo, settings)
    files.write_records(files.root / RECORDS_FILE, level.records)
    terms = term_intervals(level.records, slo, seed=seed)
    kept_up = level.served_fraction >= settings.min_served_fraction
    return {
        "rate_rps": chosen.rate_rps,
        "default": {
            "meets_slo": bool(level.passed),
            "slo_met": bool(level.slo_met),
            "served_fraction": level.served_fraction,
            "error_rate": level.error_rate,
            "kept_up": kept_up,
            "terms": [term_dict(t) for t in terms],
        },
        "recommended": {
            "meets_slo": chosen.clears,
            "repeats": chosen.repeats,
            "served_fraction": chosen.served_fraction,
            "error_rate": chosen.error_rate,
            "terms": [term_dict(t) for t in chosen.terms],
        },
    }


def missed_terms(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The SLO terms one config's point estimate broke at that rate."""
    return [t for t in config["terms"] if t["value_ms"] > t["limit_ms"]]


def same_rate_sentence(same: dict[str, Any] | None) -> str | None:
    """'At 15.6 req/s the vLLM default misses tpot_p99 (41.2 ms, limit 30 ms); ...'."""
    if not same:
        return None
    rate, d = same["rate_rps"], same["default"]
    if d["meets_slo"]:
        return f"At {rate:.2f} req/s the vLLM default also meets the SLO (measured once)."
    parts = [f"{t['metric']} {t['value_ms']:.1f} ms (limit {t['limit_ms']:g} ms; {_certainty(t)})"
             for t in missed_terms(d)]  # fmt: skip
    if not d["kept_up"]:
        parts.append(f"it completed only {d['served_fraction']:.0%} of the offered rate")
    if d["error_rate"] > 0:
        parts.append(f"{d['error_rate']:.1%} of requests failed")
    why = "; ".join(parts) or "it did not hold the SLO"
    return f"At the recommended {rate:.2f} req/s the vLLM default misses the SLO: {why}."


def unsettled_interval(t: dict[str, Any]) -> str | None:
    """'95% interval 20.3-164.1 ms' when a missed term's interval reaches below its limit, None
    when the whole interval lies above it. One level of ~100 requests pins a p99 loosely, so
    such a miss is a point estimate, not a settled fact."""
    if t["low_ms"] > t["limit_ms"]:
        return None
    return f"95% interval {t['low_ms']:.1f}-{t['high_ms']:.1f} ms"


def _certainty(t: dict[str, Any]) -> str:
    interval = unsettled_interval(t)
    if interval is None:
        return "its whole 95% interval lies above"
    return f"{interval}: one level does not settle it"


def same_rate_rows(same: dict[str, Any] | None) -> tuple[list[str], list[list[str]]] | None:
    """A config-by-term table of the two configs at the same rate."""
    if not same:
        return None
    metrics = [t["term"] for t in same["recommended"]["terms"]]
    header = ["at " + f"{same['rate_rps']:.2f} req/s", *metrics, "served", "meets SLO"]
    rows = []
    for label, key in (("recommended", "recommended"), ("vLLM default", "default")):
        e = same[key]
        cells = [_term_cell(t) for t in e["terms"]]
        meets = "yes" if e["meets_slo"] else "no"
        rows.append([label, *cells, f"{e['served_fraction']:.0%}", meets])
    return header, rows


def _term_cell(t: dict[str, Any]) -> str:
    return f"{t['value_ms']:.1f} ms [{t['low_ms']:.1f}, {t['high_ms']:.1f}]"
