"""The report's figures as PNG bytes (matplotlib, no display needed), from the run's records,
and knob importance from the study."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import optuna
from optuna.trial import TrialState

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tuner.search.space import THRESHOLD_FRACTION, THRESHOLD_SWITCH
from tuner.store.records import TrialRecord
from tuner.targets.knobs import KNOBS, knobs_to_json

_BLUE, _ORANGE, _GREY, _GREEN, _RED = "#1f77b4", "#ff7f0e", "#9a9a9a", "#2ca02c", "#d62728"
# Colour, marker and legend label of each role (the budget sweep is drawn as search).
_STYLES = {"recommended": (_GREEN, "*", "recommended"), "default": (_RED, "s", "vLLM default"),
           "rule_of_thumb": (_ORANGE, "D", "rule of thumb"),
           "search": (_BLUE, "o", "search")}  # fmt: skip


@dataclass(frozen=True)
class TrialPoint:
    """One trial as the plots see it."""

    number: int
    role: str
    state: str  # "complete" | "pruned"
    knobs: dict[str, Any]
    capacity_rps: float | None  # None for pruned trials
    upper_bound_rps: float | None
    ttft_p99_s: float | None  # at the trial's highest passing rate (else its first level)
    tpot_p99_s: float | None
    rate_rps: float | None
    recommended: bool = False


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    # Constrained layout fits labels in one drawing pass; bbox_inches="tight" needs two.
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def pareto_plot(points: Sequence[TrialPoint], ttft_limit_s: float | None,
                tpot_limit_s: float | None) -> bytes:  # fmt: skip
    """TTFT p99 against TPOT p99, one point per trial, the Pareto front joined."""
    pts = [p for p in points if _finite(p.ttft_p99_s) and _finite(p.tpot_p99_s)]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    for p in pts:
        color, marker = _style(p)
        ax.scatter(p.tpot_p99_s * 1e3, p.ttft_p99_s * 1e3, c=color, marker=marker,
                   s=80 if p.recommended or p.role != "search" else 36, zorder=3,
                   edgecolors="black" if p.recommended else "none")  # fmt: skip
    front = _pareto([(p.tpot_p99_s * 1e3, p.ttft_p99_s * 1e3) for p in pts])  # type: ignore[operator]
    if len(front) > 1:
        xs, ys = zip(*front, strict=True)
        ax.plot(xs, ys, color=_GREY, linestyle="--", linewidth=1, zorder=2, label="Pareto front")
    if tpot_limit_s:
        ax.axvline(tpot_limit_s * 1e3, color=_RED, linewidth=1, label="TPOT p99 limit")
    if ttft_limit_s:
        ax.axhline(ttft_limit_s * 1e3, color=_RED, linewidth=1, linestyle=":",
                   label="TTFT p99 limit")  # fmt: skip
    for color, marker, label in _STYLES.values():
        ax.scatter([], [], c=color, marker=marker, label=label)
    ax.legend(loc="best", fontsize=8)
    ax.set(xlabel="TPOT p99 (ms)", ylabel="TTFT p99 (ms)", yscale="log",
           title="Latency trade-off (each trial at its highest passing rate)")  # fmt: skip
    ax.grid(alpha=0.3)
    return _png(fig)


def knob_plots(points: Sequence[TrialPoint], knobs: Sequence[str]) -> bytes:
    """Capacity against each searched knob; pruned trials show their upper bound."""
    knobs = list(knobs) or ["max_num_batched_tokens"]
    cols = min(3, len(knobs))
    rows = math.ceil(len(knobs) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False, layout="constrained"
    )
    for ax, knob in zip(axes.flat, knobs, strict=False):
        for p in points:
            x = p.knobs.get(knob)
            if x is None:
                continue
            x = getattr(x, "value", x)
            if p.state == "pruned":
                if _finite(p.upper_bound_rps):
                    ax.scatter([x], [p.upper_bound_rps], marker="v", facecolors="none",
                               edgecolors=_GREY, s=30)  # fmt: skip
                continue
            color, marker = _style(p)
            ax.scatter([x], [p.capacity_rps or 0.0], c=color, marker=marker, s=40, zorder=3)
        if knob in ("max_num_batched_tokens", "max_num_seqs"):
            ax.set_xscale("log", base=2)
        ax.set(xlabel=KNOBS[knob].label if knob in KNOBS else knob, ylabel="capacity (req/s)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(knobs) :]:
        ax.set_visible(False)
    fig.suptitle("Capacity against each knob (hollow v: pruned, capacity below this)")
    return _png(fig)


def importance_plot(importance: dict[str, float]) -> bytes:
    """Horizontal bars of Optuna's parameter importances."""
    names = list(importance)[::-1]
    fig, ax = plt.subplots(figsize=(6.0, 0.5 * len(names) + 1.2), layout="constrained")
    ax.barh(names, [importance[n] for n in names], color=_BLUE)
    ax.set(xlabel="importance (share of capacity variance)",
           title="Which knobs mattered (fANOVA over finished trials)")  # fmt: skip
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


def progress_plot(points: Sequence[TrialPoint]) -> bytes:
    """Each trial's capacity in order, with the best so far."""
    ordered = sorted(points, key=lambda p: p.number)
    fig, ax = plt.subplots(figsize=(6.4, 3.4), layout="constrained")
    best, xs, ys = 0.0, [], []
    for p in ordered:
        if p.state == "complete" and p.capacity_rps is not None:
            color, marker = _style(p)
            ax.scatter([p.number + 1], [p.capacity_rps], c=color, marker=marker, zorder=3)
            best = max(best, p.capacity_rps)
        elif _finite(p.upper_bound_rps):
            ax.scatter([p.number + 1], [p.upper_bound_rps], marker="v", facecolors="none",
                       edgecolors=_GREY)  # fmt: skip
        xs.append(p.number + 1)
        ys.append(best)
    ax.step(xs, ys, where="post", color=_GREEN, label="best so far")
    ax.set(xlabel="trial", ylabel="capacity (req/s)", title="Search progress")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _png(fig)


def _style(p: TrialPoint) -> tuple[str, str]:
    color, marker, _ = _STYLES.get("recommended" if p.recommended else p.role, _STYLES["search"])
    return color, marker


def _pareto(xy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes, sorted by x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(xy):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


PARAM_LABELS = {
    THRESHOLD_SWITCH: "threshold on/off",
    THRESHOLD_FRACTION: "threshold / budget",
    **{k.name: k.label for k in KNOBS.values()},
}
FIGURE_TITLES = {
    "pareto": "TTFT p99 against TPOT p99",
    "knobs": "Capacity against each knob",
    "importance": "Knob importance",
    "progress": "Search progress",
}


def trial_points(trials: list[TrialRecord], recommended: int | None) -> list[TrialPoint]:
    """Each finished trial at its highest passing rate (else its first level); one that a
    later attempt went on from is that attempt's point."""
    out, gone_on = [], {t.continues for t in trials}
    for t in trials:
        levels = t.search_levels
        if not t.finished or not levels or t.number in gone_on:
            continue
        passing = [lv for lv in levels if lv.passed]
        level = max(passing, key=lambda lv: lv.rate_rps) if passing else levels[0]
        complete = t.state is TrialState.COMPLETE
        out.append(TrialPoint(
            number=t.number, role=t.role.value, state="complete" if complete else "pruned",
            knobs=knobs_to_json(t.knobs), capacity_rps=t.capacity_rps if complete else None,
            upper_bound_rps=t.upper_bound_rps, ttft_p99_s=level.latency.ttft_p99_s,
            tpot_p99_s=level.latency.tpot_p99_s, rate_rps=level.rate_rps,
            recommended=t.number == recommended,
        ))  # fmt: skip
    return out


def importance(study: optuna.Study) -> dict[str, float] | None:
    """Optuna's fANOVA importances over finished trials, None when there are too few."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 3 or len({t.value for t in done}) < 2:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raw = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):
        return None
    return {PARAM_LABELS.get(k, k): float(v) for k, v in raw.items()} or None


def report_figures(rec: dict[str, Any], trials: list[TrialRecord]) -> dict[str, bytes]:
    """PNG bytes of each figure the report shows."""
    best = rec.get("best") or {}
    points = trial_points(trials, best.get("trial"))
    limits = {t.get("metric"): t.get("limit_ms") for t in (best.get("terms") or [])}
    figures = {}
    if points:
        ttft, tpot = limits.get("ttft_p99"), limits.get("tpot_p99")
        figures["pareto"] = pareto_plot(points, ttft and ttft / 1e3, tpot and tpot / 1e3)
        figures["knobs"] = knob_plots(points, list(rec.get("search", {}).get("space", {})))
        figures["progress"] = progress_plot(points)
    if rec.get("importance"):
        figures["importance"] = importance_plot(rec["importance"])
    return figures
