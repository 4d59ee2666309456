"""The report's figures as PNG bytes (matplotlib, no display needed)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tuner.targets.knobs import KNOBS

_BLUE, _ORANGE, _GREY, _GREEN, _RED = "#1f77b4", "#ff7f0e", "#9a9a9a", "#2ca02c", "#d62728"


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
    _legend_roles(ax)
    ax.set_xlabel("TPOT p99 (ms)")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_yscale("log")
    ax.set_title("Latency trade-off (each trial at its highest passing rate)")
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
        ax.set_xlabel(KNOBS[knob].label if knob in KNOBS else knob)
        ax.set_ylabel("capacity (req/s)")
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
    ax.set_xlabel("importance (share of capacity variance)")
    ax.set_title("Which knobs mattered (fANOVA over finished trials)")
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
    ax.set_xlabel("trial")
    ax.set_ylabel("capacity (req/s)")
    ax.set_title("Search progress")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _png(fig)


def _style(p: TrialPoint) -> tuple[str, str]:
    if p.recommended:
        return _GREEN, "*"
    if p.role == "default":
        return _RED, "s"
    if p.role == "rule_of_thumb":
        return _ORANGE, "D"
    return _BLUE, "o"


def _legend_roles(ax: Any) -> None:
    for label, color, marker in (
        ("recommended", _GREEN, "*"),
        ("vLLM default", _RED, "s"),
        ("rule of thumb", _ORANGE, "D"),
        ("search", _BLUE, "o"),
    ):
        ax.scatter([], [], c=color, marker=marker, label=label)  # fmt: skip
    ax.legend(loc="best", fontsize=8)


def _pareto(xy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes, sorted by x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(xy):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
