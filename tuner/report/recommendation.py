"""The recommendation: what to run, how much it serves, against the default and the table."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.confirm.same_rate import missed_terms, unsettled_interval
from tuner.measure.keepup import MIN_SERVED_FRACTION
from tuner.measure.level import MAX_ERROR_RATE
from tuner.report.flags import flag_notes, sglang_flags, vllm_flags
from tuner.search.rules import RULE_OF_THUMB_TEXT, Scenario
from tuner.search.study import CONSTRAINTS, ROLE, Role, trial_with_role
from tuner.search.trial import CAPACITY, KNOBS, OUTCOME, UPPER
from tuner.store.runfiles import RunFiles, clean_json, trial_levels

CAPACITY_DEFINITION = (
    "goodput (max req/s within SLO): the highest Poisson arrival rate of this workload at "
    "which every SLO term holds and under 1% of requests fail (DistServe, OSDI'24)"
)
GOODPUT_DEFINITION = (
    "goodput at the fixed rate: requests meeting every per-request SLO bound per second "
    "(vllm bench serve's request_goodput), with each SLO term as a constraint"
)


def build_recommendation(
    study: optuna.Study,
    run_info: dict[str, Any],
    confirmation: dict[str, Any],
    files: RunFiles,
) -> dict[str, Any]:
    """The recommendation JSON from the study, the run's settings and the confirmation."""
    mode = run_info.get("mode", "capacity")
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    candidates = {c["trial"]: c for c in confirmation.get("candidates", [])}
    chosen = candidates.get(confirmation.get("chosen_trial"))
    default = trial_with_role(finished, Role.DEFAULT)
    thumb = trial_with_role(finished, Role.RULE_OF_THUMB) or default
    best = _config_entry(study.trials[chosen["trial"]], chosen) if chosen else None
    default_entry = _config_entry(default, candidates.get(default.number)) if default else None
    thumb_entry = _config_entry(thumb, candidates.get(thumb.number)) if thumb else None
    scenario = Scenario(run_info.get("scenario", Scenario.CHAT.value))
    if thumb_entry is not None:
        thumb_entry["scenario"] = scenario.value
        thumb_entry["table"] = RULE_OF_THUMB_TEXT[scenario]
        thumb_entry["same_as_default"] = thumb is default
    feasible = best is not None and best["capacity_rps"] > 0
    rec: dict[str, Any] = {
        "slo": run_info.get("slo"),
        "objective": {
            "mode": mode,
            "rate_rps": run_info.get("rate_rps"),
            "definition": GOODPUT_DEFINITION if mode == "goodput" else CAPACITY_DEFINITION,
        },
        "workload": run_info.get("workload", {}),
        "target": run_info.get("target", {}),
        "environment": run_info.get("environment", {}),
        "feasible": feasible,
        "best": best if feasible else None,
        "default": default_entry,
        "rule_of_thumb": thumb_entry,
        "ratio_vs_default": _ratio(best, default_entry) if feasible else None,
        "ratio_vs_rule_of_thumb": _ratio(best, thumb_entry) if feasible else None,
        "default_at_recommended_rate": confirmation.get("default_at_recommended_rate"),
        "flags": _flags(best) if feasible else None,
        "closest": None if feasible else _closest(finished),
        "top": sorted(candidates.values(), key=lambda c: -(c["confirmed_rps"] or 0)),
        "trials": [_trial_row(t) for t in finished],
        "search": {
            "sampler": run_info.get("settings", {}).get("sampler"),
            "trials_finished": len(finished),
            "trials_pruned": sum(t.state is TrialState.PRUNED for t in finished),
            "levels_measured": sum(len(trial_levels(t)) for t in trials),
            "measurement_s": sum(lv.get("wall_s") or 0.0 for t in trials for lv in trial_levels(t)),
            "stopped_by": confirmation.get("stopped_by"),
            "elapsed_s": confirmation.get("elapsed_s"),
            "space": run_info.get("space", {}),
            "fixed": run_info.get("fixed", {}),
        },
        "run_dir": str(files.root),
    }
    rec["summary"] = summary_line(rec)
    return clean_json(rec)


def summary_line(rec: dict[str, Any]) -> str:
    """The one sentence a reader needs."""
    slo = rec["slo"]
    if not rec["feasible"]:
        c = rec.get("closest")
        if not c:
            return f"no config meets {slo}; nothing finished a load level"
        return (
            f"no config meets {slo}; the closest is trial {c['trial'] + 1} "
            f"({_short(c['config'])}) with {c['term']} {c['value_ms']:.1f} ms "
            f"(limit {c['limit_ms']:g} ms) at {c['rate_rps']:.2f} req/s"
        )
    best, unit = rec["best"], _unit(rec)
    text = f"recommended: {_short(best['config'])} serves {best['capacity_rps']:.2f} {unit}"
    ratio, default = rec.get("ratio_vs_default"), rec.get("default")
    if ratio is not None:
        text += f", {ratio:.2f}x the vLLM default's {default['capacity_rps']:.2f}"
    elif default is not None:
        text += f"; the vLLM default meets {slo} at no measured rate"
    same = rec.get("default_at_recommended_rate")
    if same and not same["default"]["meets_slo"]:
        misses = missed_terms(same["default"])
        what = (f"{misses[0]['metric']} {misses[0]['value_ms']:.1f} ms" if misses
                else "it falls behind")  # fmt: skip
        interval = unsettled_interval(misses[0]) if misses else None
        if interval:
            what += f", {interval}"
        text += f"; at that rate the default misses the SLO ({what})"
    return text


def _unit(rec: dict[str, Any]) -> str:
    return "good req/s" if rec["objective"]["mode"] == "goodput" else "req/s within " + rec["slo"]


def _config_entry(trial: FrozenTrial, candidate: dict[str, Any] | None) -> dict[str, Any]:
    """One config's capacity and terms: confirmed figures when it was re-measured."""
    levels = trial_levels(trial)
    search_value = float(trial.value or 0.0) if trial.state is TrialState.COMPLETE else 0.0
    entry: dict[str, Any] = {
        "trial": trial.number,
        "role": trial.user_attrs.get(ROLE, Role.SEARCH.value),
        "config": trial.user_attrs.get(KNOBS, {}),
        "capacity_rps": search_value,
        "search_capacity_rps": search_value,
        "confirmed": False,
    }
    level = _level_at(levels, trial.user_attrs.get(CAPACITY)) or (levels[0] if levels else {})
    entry["limited_by"] = limited_by(levels, trial.user_attrs.get(CAPACITY) or 0.0)
    entry["rate_rps"] = level.get("rate_rps")
    entry["terms"] = _level_terms(level)
    entry["binding"] = level.get("binding")
    if candidate is not None:
        entry.update(
            capacity_rps=candidate["confirmed_rps"] if candidate["clears"] else search_value,
            confirmed=bool(candidate["clears"]),
            repeats=candidate["repeats"],
            rate_rps=candidate["rate_rps"],
            terms=candidate["terms"],
            capacity_ci=candidate.get("capacity_ci"),
            goodput_ci=candidate.get("goodput_ci"),
        )
        entry["binding"] = min(candidate["terms"], key=lambda t: t["margin"])["metric"]
    return entry


def limited_by(levels: list[dict[str, Any]], capacity_rps: float) -> str:
    """What failed at the lowest failing rate above the capacity, in words."""
    failing = [lv for lv in levels if not lv.get("passed") and lv.get("rate_rps", 0) > capacity_rps]
    if not failing:
        return "not reached: the search stopped before any rate failed"
    lv = min(failing, key=lambda x: x["rate_rps"])
    rate = f"{lv['rate_rps']:.2f} req/s"
    if (lv.get("error_rate") or 0.0) >= MAX_ERROR_RATE:
        return f"errors: {lv['error_rate']:.0%} of requests failed at {rate}"
    if not lv.get("slo_met", True):
        metric = lv.get("binding")
        value = lv.get(f"slo_{metric}_s")
        shown = f" {value * 1e3:.1f} ms" if value is not None else ""
        return f"{metric}{shown} over its limit at {rate}"
    served = lv.get("served_fraction")
    if served is not None and served < MIN_SERVED_FRACTION:
        return f"queue: completions kept pace with only {served:.1%} of arrivals at {rate}"
    return f"the load generator fell behind its schedule at {rate}"


def _level_at(levels: list[dict[str, Any]], rate: float | None) -> dict[str, Any] | None:
    hits = [lv for lv in levels if rate and lv.get("rate_rps") == rate]
    return hits[-1] if hits else None


def _level_terms(level: dict[str, Any]) -> list[dict[str, Any]]:
    terms = []
    for key, value in level.items():
        if key.startswith("slo_") and key.endswith("_s") and value is not None:
            metric = key[4:-2]
            margin = level.get(f"slo_{metric}_margin")
            limit_s = value / (1 - margin) if margin is not None and margin != 1 else None
            limit_ms = limit_s * 1e3 if limit_s else None
            terms.append(
                {"metric": metric, "value_ms": value * 1e3, "limit_ms": limit_ms, "margin": margin}
            )
    return terms


def _ratio(best: dict[str, Any] | None, other: dict[str, Any] | None) -> float | None:
    if not best or not other or not other.get("capacity_rps"):
        return None
    return best["capacity_rps"] / other["capacity_rps"]


def _flags(best: dict[str, Any] | None) -> dict[str, Any] | None:
    if not best:
        return None
    knobs = best["config"]
    return {"vllm": vllm_flags(knobs), "sglang": sglang_flags(knobs), "notes": flag_notes(knobs)}


def _closest(trials: list[FrozenTrial]) -> dict[str, Any] | None:
    """The level that came nearest to meeting the SLO (largest binding margin)."""
    best: tuple[float, FrozenTrial, dict[str, Any]] | None = None
    for trial in trials:
        for level in trial_levels(trial):
            margin = level.get("binding_margin")
            if margin is not None and (best is None or margin > best[0]):
                best = (margin, trial, level)
    if best is None:
        return None
    margin, trial, level = best
    metric = level.get("binding")
    value_s = level.get(f"slo_{metric}_s")
    limit_ms = value_s * 1e3 / (1 - margin) if value_s is not None and margin != 1 else None
    return {
        "trial": trial.number,
        "config": trial.user_attrs.get(KNOBS, {}),
        "rate_rps": level.get("rate_rps"),
        "term": metric,
        "value_ms": value_s * 1e3 if value_s is not None else math.nan,
        "limit_ms": limit_ms,
        "margin": margin,
    }


def _trial_row(t: FrozenTrial) -> dict[str, Any]:
    levels = trial_levels(t)
    return {
        "trial": t.number,
        "role": t.user_attrs.get(ROLE, Role.SEARCH.value),
        "state": t.state.name.lower(),
        "config": t.user_attrs.get(KNOBS, {}),
        "capacity_rps": t.user_attrs.get(CAPACITY),
        "upper_bound_rps": t.user_attrs.get(UPPER),
        "value": t.value if t.state is TrialState.COMPLETE else None,
        "feasible": all(c <= 0 for c in t.user_attrs.get(CONSTRAINTS, [])),
        "outcome": t.user_attrs.get(OUTCOME),
        "levels": len(levels),
        "measurement_s": sum(lv.get("wall_s") or 0.0 for lv in levels),
    }


def _short(config: dict[str, Any]) -> str:
    from tuner.report.live import short_config

    return short_config(config)


def write_reports(rec: dict[str, Any], study: optuna.Study, files: RunFiles) -> list[Any]:
    """recommendation.json, .md (plots as PNG files) and a self-contained .html."""
    from tuner.report.render import render_html, render_markdown, report_figures

    figures = report_figures(rec, study)
    files.plots_dir.mkdir(parents=True, exist_ok=True)
    for name, png in figures.items():
        (files.plots_dir / f"{name}.png").write_bytes(png)
    paths = [files.write_json("recommendation.json", rec)]
    for name, text in (
        ("recommendation.md", render_markdown(rec, figures)),
        ("recommendation.html", render_html(rec, figures)),
    ):
        path = files.root / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
