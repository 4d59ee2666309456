"""The recommendation JSON: what to run, how much it serves, against the default and the table.

Built from a `RunView` (typed trial records and the confirmation), never from Optuna attributes.
"""

from __future__ import annotations

import math
from typing import Any

from optuna.trial import TrialState

from tuner.measure.meter import machine_summary
from tuner.report.summary import (
    WITHIN_NOISE,
    flag_notes,
    headline,
    sglang_flags,
    summary_line,
    vllm_flags,
)
from tuner.search.space import BUDGET
from tuner.search.starting import RULE_OF_THUMB_TEXT, Scenario, rule_of_thumb_knobs
from tuner.store import attrs
from tuner.store.codec import candidate_json, clean_json, same_rate_json, term_json
from tuner.store.records import Candidate, Confirmation, Mode, Role, TrialRecord
from tuner.store.runfiles import RunView
from tuner.targets.knobs import knobs_to_json

CAPACITY_DEFINITION = (
    "goodput (max req/s within SLO): the highest Poisson arrival rate of this workload at "
    "which every SLO term holds and under 1% of requests fail (DistServe, OSDI'24)"
)
GOODPUT_DEFINITION = (
    "goodput at the fixed rate: requests meeting every per-request SLO bound per second "
    "(vllm bench serve's request_goodput), with each SLO term as a constraint"
)
DEFINITIONS = {Mode.CAPACITY: CAPACITY_DEFINITION, Mode.GOODPUT: GOODPUT_DEFINITION}


def build_recommendation(
    view: RunView, conf: Confirmation, workers: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The recommendation JSON from the run's records, its confirmation and what each worker
    did."""
    info = view.info
    candidates = {c.trial: c for c in conf.candidates}
    chosen = conf.chosen
    best = config_entry(view.trial(chosen.trial), chosen) if chosen else None
    default, thumb = _references(view, candidates, info)
    if best is not None and default is not None and best["config"] == default["config"]:
        # Keeping the default: one config, one figure (its confirmed strict-rule rate beside
        # its own pooled capacity once read "0.76x the vLLM default" of itself).
        best = default
    feasible = best is not None and best["capacity_rps"] > 0
    closest = None if feasible else _closest(view.trials)
    rec: dict[str, Any] = {
        "slo": info.get("slo"),
        "objective": {"mode": view.mode.value, "rate_rps": info.get("rate_rps"),
                      "definition": DEFINITIONS[view.mode]},
        "workload": info.get("workload", {}),
        "target": info.get("target", {}),
        "environment": info.get("environment", {}),
        "feasible": feasible,
        "best": best if feasible else None,
        "default": default,
        "rule_of_thumb": thumb,
        "ratio_vs_default": _ratio(best, default) if feasible else None,
        "ratio_vs_rule_of_thumb": _ratio(best, thumb) if feasible else None,
        "default_at_recommended_rate": same_rate_json(conf.same_rate),
        "flags": _flags(best["config"]) if best and feasible else None,
        "closest": closest,
        "time_cut": None if feasible else _time_cut(view.trials, closest,
                                                    info.get("settings", {}).get("time_budget_s")),
        "top": sorted((candidate_json(c) for c in conf.candidates),
                      key=lambda c: -(c["confirmed_rps"] or 0)),
        "trials": [_trial_row(t) for t in view.trials if t.state is not TrialState.WAITING],
        "search": _search(view, conf),
        "elapsed_s": conf.elapsed_s,
        "phases_s": conf.phases_s,
        "engine": _engine(info),
        "vllm_starts": _vllm_starts(view, info),
        "sim": _sim(view),
        "robustness": _robustness(view),
        "workers": workers or [],
        # Where the confirming worker kept its records (so any worker reports the same).
        "run_dir": info.get("path") or str(view.files.root),
    }  # fmt: skip
    rec["headline"] = headline(rec)
    # What the summary tells the reader to run: `best` is the best config confirmed, which the
    # headline may still send back to the default as within noise of it.
    rec["recommended"] = best if feasible else None
    if rec["headline"]["basis"] == WITHIN_NOISE and default is not None:
        # The default is the recommendation: its flags are the ones to keep (none changed).
        rec["flags"] = _flags(default["config"])
        rec["recommended"] = default
    rec["summary"] = summary_line(rec)
    return clean_json(rec)


def _references(
    view: RunView, candidates: dict[int, Candidate], info: dict[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The default's and the rule of thumb's entries. The default stands in for a rule of
    thumb that equals it; one that differs and was not measured (screening measures only the
    default) is entered as such, with its simulated capacity when the run has one."""
    default = view.with_role(Role.DEFAULT)
    thumb = view.with_role(Role.RULE_OF_THUMB)
    default_entry = (config_entry(default, candidates.get(default.number), reference=True)
                     if default else None)  # fmt: skip
    scenario = Scenario(info.get("scenario", Scenario.CHAT.value))
    table = {"scenario": scenario.value, "table": RULE_OF_THUMB_TEXT[scenario]}
    if thumb is not None:
        entry = config_entry(thumb, candidates.get(thumb.number), reference=True)
        return default_entry, {**entry, **table, "measured": True, "same_as_default": False}
    if default is None:
        return None, None
    simulated = (attrs.sim_summary(view.study) or {}).get("rule_of_thumb")
    knobs = rule_of_thumb_knobs(scenario, default.knobs)
    if simulated is None and knobs[BUDGET] == default.knobs.get(BUDGET):
        entry = config_entry(default, candidates.get(default.number), reference=True)
        return default_entry, {**entry, **table, "measured": True, "same_as_default": True}
    return default_entry, {
        **table, "config": simulated["config"] if simulated else knobs_to_json(knobs),
        "measured": False, "capacity_rps": None, "same_as_default": False,
        "simulated_rps": simulated["simulated_rps"] if simulated else None,
    }  # fmt: skip


def config_entry(trial: TrialRecord, candidate: Candidate | None,
                 reference: bool = False) -> dict[str, Any]:  # fmt: skip
    """One config's capacity and terms: confirmed figures when it was re-measured.

    A recommendation's capacity is one its pooled runs clear with each term's whole interval,
    and each run passes on its own;
    a reference's (the default, the rule of thumb: what a user runs today) is the highest
    rate its pooled runs pass on point estimates, which is never lower. A ratio of the first
    over the second is, if anything, understated: a stall-prone default's p99 interval is wide,
    and judged by the strict rule its capacity read 10.7 req/s on vLLM where loadgen found it
    meeting the SLO at 16.1 in three draws of three."""
    value = float(trial.value or 0.0) if trial.state is TrialState.COMPLETE else 0.0
    level = trial.level_at(trial.capacity_rps) or next(iter(trial.search_levels), None)
    verdict = candidate.verdict if candidate else (level.verdict if level else None)
    binding = verdict.binding if verdict else None
    entry: dict[str, Any] = {
        "trial": trial.number, "role": trial.role.value, "config": knobs_to_json(trial.knobs),
        "capacity_rps": value, "search_capacity_rps": value, "confirmed": False,
        "limited_by": limited_by(trial), "rate_rps": verdict.rate_rps if verdict else None,
        "terms": [term_json(t) for t in verdict.terms] if verdict else [],
        "binding": binding.name if binding else None,
        "lower_bound": bool(trial.ending and trial.ending.cut),
    }  # fmt: skip
    pooled = candidate.capacity_ci.point if candidate and candidate.capacity_ci else None
    if candidate is not None and reference and pooled:
        entry.update(capacity_rps=pooled, confirmed=True, repeats=candidate.repeats,
                     capacity_rule="pooled point estimates",
                     capacity_ci=candidate_json(candidate)["capacity_ci"])  # fmt: skip
    elif candidate is not None:
        if reference and candidate.repeats and candidate.capacity_ci is not None:
            # Re-measured and passing at no rate tried: its search capacity is not one the
            # report can compare against (the summary says so instead of giving a ratio).
            entry["held_when_remeasured"] = False
        entry.update(capacity_rps=candidate.confirmed_rps if candidate.clears else value,
                     confirmed=candidate.clears, repeats=candidate.repeats,
                     capacity_ci=candidate_json(candidate)["capacity_ci"],
                     goodput_ci=candidate_json(candidate)["goodput_ci"])  # fmt: skip
    return entry


def limited_by(trial: TrialRecord) -> str:
    """What failed at the lowest failing rate above the capacity, in words (an earlier
    attempt's levels too, where the trial went on from one)."""
    capacity = trial.capacity_rps or 0.0
    failing = [lv for lv in trial.search_levels if not lv.passed and lv.rate_rps > capacity]
    if not failing and trial.ending and trial.ending.cut:
        return f"not measured: its search was cut short ({trial.ending.value}), a lower bound"
    if not failing:
        return "not reached: the search stopped before any rate failed"
    level = min(failing, key=lambda lv: lv.rate_rps)
    server = level.server.describe()
    return level.verdict.reason() + (f" (server: {server})" if server else "")


def _ratio(best: dict[str, Any] | None, other: dict[str, Any] | None) -> float | None:
    if not best or not other or not other.get("capacity_rps"):
        return None
    return best["capacity_rps"] / other["capacity_rps"]


def _flags(knobs: dict[str, Any]) -> dict[str, Any]:
    # vLLM's flags are the ones the measured server ran with (or engine_lite's exact copy of
    # its scheduler); SGLang's are a translation no test has run.
    return {"vllm": vllm_flags(knobs), "sglang": sglang_flags(knobs), "sglang_tested": False,
            "notes": flag_notes(knobs)}  # fmt: skip


def _closest(trials: list[TrialRecord]) -> dict[str, Any] | None:
    """The level that came nearest to meeting the SLO (its binding term's largest margin), in
    any trial: a measurement cut short still measured its levels."""
    levels = [(t, lv, lv.verdict.binding) for t in trials for lv in t.levels]
    scored = [x for x in levels if x[2] is not None and math.isfinite(x[2].margin_frac)]
    if not scored:
        return None
    trial, level, term = max(scored, key=lambda x: x[2].margin_frac)  # type: ignore[union-attr]
    return {"trial": trial.number, "config": knobs_to_json(trial.knobs),
            "rate_rps": level.rate_rps, **term_json(term)}  # fmt: skip


def _time_cut(trials: list[TrialRecord], closest: dict[str, Any] | None,
              budget_s: float | None) -> dict[str, Any] | None:  # fmt: skip
    """No level passed and the deadline kept a search from its next level: the closest
    trial's next level, or else the slowest one left out, and the budget under which it would
    have fitted (a slow target, whose levels take minutes): the budget of the run that left it
    out, which a resume may have changed. Not the quickest: that may be a config far from
    meeting the SLO."""
    left = [(t, t.left_out) for t in trials if t.left_out is not None]
    if not left or any(lv.passed for t in trials for lv in t.levels):
        return None
    near = [x for x in left if closest and x[0].number == closest["trial"]]
    trial, level = near[0] if near else min(left, key=lambda x: x[1].rate_rps)
    return {"trial": trial.number, "rate_rps": level.rate_rps, "requests": level.requests,
            "level_s": level.expected_s,
            "budget_needed_s": (level.budget_s or budget_s or 0.0) + level.short_s}  # fmt: skip


def _trial_row(t: TrialRecord) -> dict[str, Any]:
    complete = t.state is TrialState.COMPLETE
    return {
        "trial": t.number, "role": t.role.value, "state": t.state.name.lower(),
        "config": knobs_to_json(t.knobs), "capacity_rps": t.capacity_rps,
        "upper_bound_rps": t.upper_bound_rps, "value": t.value if complete else None,
        "feasible": t.feasible, "outcome": t.ending.value if t.ending else None,
        "levels": len(t.levels), "measurement_s": t.measurement_s, "worker": t.worker,
        "retry_of": t.retry_of, "same_as": t.same_as, "continues": t.continues,
        "carried_levels": len(t.carried),
    }  # fmt: skip


def _engine(info: dict[str, Any]) -> dict[str, Any]:
    """What served the measurements: the target's kind and its own description."""
    target = info.get("target", {})
    kind = target.get("kind")
    name = {"builtin": "engine_lite", "vllm": "vllm"}.get(kind, kind)
    return {"name": name, "kind": kind, "described": target.get("description")}


def _vllm_starts(view: RunView, info: dict[str, Any]) -> dict[str, Any] | None:
    """How many vLLM servers the run started and how long they took (None off vLLM)."""
    if info.get("target", {}).get("kind") != "vllm":
        return None
    starts = attrs.server_starts(view.study)
    seconds = [s["seconds"] for s in starts]
    return {"count": len(starts), "total_s": round(sum(seconds), 1),
            "mean_s": round(sum(seconds) / len(seconds), 1) if seconds else None,
            "each": starts}  # fmt: skip


def _sim(view: RunView) -> dict[str, Any] | None:
    """--fidelity sim: configs screened and verified, and the largest sim-vs-real error."""
    summary = attrs.sim_summary(view.study)
    if summary is None:
        return None
    return {"configs_screened": summary["configs_screened"],
            "configs_verified": summary["configs_verified"],
            "max_error": summary["max_error"], "error_bound": summary["error_bound"],
            "max_gain_error": summary.get("max_gain_error", summary["max_error"]),
            "min_gain_error": summary.get("min_gain_error", summary["max_error"]),
            "fell_back": summary["fell_back"], "screen_s": summary["screen_s"],
            "model_source": summary["model_source"], "verified": summary["verified"],
            "chunk_probe": summary.get("chunk_probe"),
            "verification_ended": summary.get("verification_ended")}  # fmt: skip


def _robustness(view: RunView) -> dict[str, Any] | None:
    """The top configs' simulated capacity across the traffic band, and what --robust chose by."""
    band = attrs.robustness(view.study)
    if band is None:
        return None
    robust = bool(view.settings.get("robust"))
    return {**band, "chosen_by": "best worst case (--robust)" if robust else "capacity"}


def _search(view: RunView, conf: Confirmation) -> dict[str, Any]:
    finished = view.finished
    levels = [level for t in view.trials for level in t.levels]
    shared = machine_summary(levels)
    return {
        "sampler": view.settings.get("sampler"), "trials_finished": len(finished),
        "trials_pruned": sum(t.state is TrialState.PRUNED for t in finished),
        "levels_measured": len(levels),
        # Levels run again because the client lagged, other processes took the CPU or the
        # engine's steps slowed (tuner/measure/contention.py), and the worst of a level kept.
        "levels_remeasured": shared["remeasured"],
        "max_foreign_cpu_cores": shared["max_foreign_cpu_cores"],
        "max_step_pace": shared["max_step_pace"],  # the built-in engine's (tuner/measure/pace.py)
        "measurement_s": sum(t.measurement_s for t in view.trials),
        "stopped_by": conf.stopped_by, "elapsed_s": conf.elapsed_s,
        "space": view.info.get("space", {}), "fixed": view.info.get("fixed", {}),
    }  # fmt: skip
