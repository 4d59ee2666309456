"""A step-time model fitted to what a server's clients saw, for a server that reports no steps.

vLLM does not say how long each engine step took, and on a shared CPU its tokens reach the
client up to several milliseconds apart even when one step made them (measured: a median
spread of 6 ms within a step against 2-3 ms decode steps), so steps cannot be read off one by
one. Spans can: the scheduler is vLLM 0.32's (engine_lite's, checked step by step against it),
so the level replayed through it at its send times says which steps ran between a request's
first and last token, and that time is linear in those steps' summed features; so is its
time to first token, plus a fixed cost from send to the engine. Jitter only touches a span's
ends. Which steps a span covers depends on the step times, so the fit alternates: simulate
with the current model, fit every span by non-negative least squares, repeat until it settles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine_lite.costmodel import FEATURE_NAMES, CostModel, StepFeatures, nnls_holding
from engine_lite.sim import SimEngine, SimRequest, SimTimeline, simulate
from loadgen import RequestRecord
from loadgen.stop import was_stopped
from tuner.sim.calibrate import RealLevel
from tuner.sim.target import engine_config

ROUNDS = 12
STEP_SIZES = (1.0, 0.5, 0.25, 0.1)
# Spans shorter than this are judged against it: a few milliseconds of delivery jitter would
# otherwise outweigh every long span.
FLOOR_S = 0.05
# A start before anything is known: 2 ms a step, 20 us a prefill token (a small model on a CPU).
PRIOR = CostModel(tuple(0.002 if n == "step" else 2e-5 if n == "prefill_tokens" else 0.0
                        for n in FEATURE_NAMES))  # fmt: skip


@dataclass(frozen=True, slots=True)
class SpanFit:
    model: CostModel
    num_spans: int
    mean_rel_error: float  # of the simulated spans against the real ones (floored at FLOOR_S)
    p90_rel_error: float
    rounds: int


@dataclass(frozen=True, slots=True)
class _Round:
    model: CostModel
    rows: np.ndarray  # one row per span: summed step features, then the overhead's 1
    seconds: np.ndarray

    @property
    def errors(self) -> np.ndarray:
        predicted = self.rows @ _vector(self.model)
        return np.abs(predicted - self.seconds) / np.maximum(self.seconds, FLOOR_S)

    @property
    def error(self) -> float:
        return float(np.mean(self.errors))


def fit_served(levels: Sequence[RealLevel], shape: SimEngine,
               start: CostModel = PRIOR) -> SpanFit | None:  # fmt: skip
    """The model under which the simulated spans match the real ones; None when the levels
    hold too few finished requests to fit.

    Each round fits every span by least squares under the current model's step layout, then
    moves towards that fit only as far as the simulation, rerun, gets closer to what the
    clients saw (a full step can overshoot: a slower model queues more requests per step).
    """
    current = _round(levels, shape, start)
    if len(current.seconds) < 2 * len(FEATURE_NAMES):
        return None
    rounds = 0
    while rounds < ROUNDS:
        rounds += 1
        proposal = _proposal(current, start)
        better = None
        for size in STEP_SIZES:
            blend = size * proposal + (1 - size) * _vector(current.model)
            trial = _round(levels, shape, _model(blend))
            if trial.error < current.error:
                better = trial
                break
        if better is None or current.error - better.error < 1e-3:
            current = better or current
            break
        current = better
    p90 = float(np.quantile(current.errors, 0.9))
    return SpanFit(current.model, len(current.seconds), current.error, p90, rounds)


# Spans sum steps, so they tell a chunk's context read from its attention even less than steps
# do (engine_lite.costmodel.fit): the read keeps the starting model's figure.
_KEPT = FEATURE_NAMES.index("chunk_context")


def _proposal(current: _Round, start: CostModel) -> np.ndarray:
    """Every span fitted by least squares on relative error, the kept coefficient held."""
    weights = 1.0 / np.maximum(current.seconds, FLOOR_S)
    held = {_KEPT: start.coefficients[_KEPT]}
    return nnls_holding(current.rows, current.seconds, weights, held)


def _round(levels: Sequence[RealLevel], shape: SimEngine, model: CostModel) -> _Round:
    rows: list[list[float]] = []
    seconds: list[float] = []
    for level in levels:
        r, y = _spans(level, shape, model)
        rows += r
        seconds += y
    width = len(FEATURE_NAMES) + 1
    return _Round(model, np.array(rows, dtype=float).reshape(-1, width), np.array(seconds))


def _length(rec: RequestRecord) -> int:
    """Output tokens a request ran to, or was to run to when the level cut it short."""
    return rec.output_tokens if rec.success else rec.output_len


def _vector(model: CostModel) -> np.ndarray:
    return np.array([*model.coefficients, model.request_overhead_s])


def _model(vector: np.ndarray) -> CostModel:
    return CostModel(tuple(float(c) for c in vector[:-1]), request_overhead_s=float(vector[-1]))


def _spans(level: RealLevel, shape: SimEngine, model: CostModel
           ) -> tuple[list[list[float]], list[float]]:  # fmt: skip
    """Feature rows (the steps' features summed, then a 1 for the send-to-engine cost) and
    seconds of each request's decode span and time to first token."""
    # A level stopped early (loadgen.stop) cut requests short that loaded the engine while
    # the measured ones ran: they run in the replay at their full length, and fit nothing.
    recs = [r for r in level.records if (r.success and len(r.chunk_times_s) >= 1)
            or (was_stopped(r) and math.isfinite(r.sent_s))]  # fmt: skip
    if not any(r.success for r in recs):
        return [], []
    t0 = min(r.sent_s for r in recs)
    sim = [SimRequest(r.sent_s - t0, r.prompt_len, max(1, _length(r))) for r in recs]
    steps: list[StepFeatures] = []
    lines = simulate(engine_config(level.knobs), shape, model, sim, step_log=steps)
    cum = np.vstack([np.zeros(len(FEATURE_NAMES)),
                     np.cumsum([f.vector() for f in steps], axis=0)])  # fmt: skip
    rows, ys = [], []
    for rec, line in zip(recs, lines, strict=True):
        if not rec.success:
            continue
        if len(line.token_steps) != max(1, rec.output_tokens):
            continue  # cut short by max_model_len: its span is not the real one
        first, last = line.token_steps[0], line.token_steps[-1]
        decode_s = rec.chunk_times_s[-1] - rec.chunk_times_s[0]
        if last > first and decode_s > 0:
            rows.append([*(cum[last + 1] - cum[first + 1]), 0.0])
            ys.append(decode_s)
        ttft_s = rec.chunk_times_s[0] - rec.sent_s - _wait_s(line, model)
        if ttft_s > 0:
            rows.append([*(cum[first + 1] - cum[line.admitted_step]), 1.0])
            ys.append(ttft_s)
    return rows, ys


def _wait_s(line: SimTimeline, model: CostModel) -> float:
    """Simulated time from the request reaching the engine to the step that first saw it."""
    return max(0.0, line.admitted_s - line.arrival_s - model.request_overhead_s)
