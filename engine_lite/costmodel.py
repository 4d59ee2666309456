"""A step-time model: how long one engine step takes, from what the scheduler put in it.

Features in the manner of Vidur (MLSys'24) and BLIS: a constant per step, a cost per scheduled
request and per prefill chunk (each chunk is an attention call of its own in every layer, with
its own mask and gather: about 1.3 ms a chunk on the CPU `tiny` preset when measured alone, which
a per-request cost fitted mostly on decodes underestimates tenfold; fits on serving steps, where
chunks come one or two a step beside a step's constant, put it anywhere from 0.01 to 1.65 ms),
per prefill token (the projections and MLP; a decode's share is its request's cost), attention
work (a prefill chunk of n tokens after c cached ones attends to about n * (c + n / 2)
positions; a decode reads its whole context), per position cached before a chunk (each chunk
gathers its context again in every layer: on the `tiny` preset a 16-token chunk after 3000
cached positions costs 1.4 ms more than one after none, three times what its attention work
accounts for; serving steps cannot tell the two apart, so `engine_lite.probe` measures it),
per sampled token (the logits), and per row below a small count (a CPU BLAS runs a product of
1 to 3 rows at nearly the cost of 16: on the `tiny` preset a decode step of 1 request takes
0.9 ms, of 4 requests 2.9 ms, of 16 5.1 ms, a line no per-request cost draws; fitted without
it on `mixed`, the model read `chat` steps of 60 requests 50% too slow). A fit tells a row's
cost from its context's only where its steps' batches vary in both: every fit of the built-in
engine adds steps of 1 to 96 decodes (`tuner/sim/decode_sweep.py`).
Coefficients are fitted by non-negative least squares on relative error, so the many short
decode steps that decide TPOT weigh as much as the few long prefill steps, and each band of
batch sizes (WIDTHS) weighs alike: on `mixed`, 16k of 23k steps hold 1 to 4 requests, and fitted
on them as they came, the model read `chat`'s decode steps of 5 to 16 requests at 0.79-0.86 of
their real time; with the bands weighed alike, at 0.94-1.06 (one set of steps, with the decode
burst of `tuner/sim/decode_sweep.py`).
Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from engine_lite.errors import EngineLiteError


@dataclass(frozen=True, slots=True)
class StepFeatures:
    """What one step computed, in the units the cost model is linear in."""

    num_reqs: int = 0
    prefill_chunks: int = 0  # prefill entries of more than one token (attended one by one)
    prefill_tokens: int = 0
    prefill_attn: float = 0.0  # sum over prefill chunks of n * (c + n / 2)
    decode_context: int = 0  # sum over decodes of the positions attended
    sampled: int = 0  # rows whose logits are computed
    small_rows: int = 0  # rows through the projections, up to SMALL_ROWS
    chunk_context: int = 0  # sum over prefill chunks of the positions cached before them

    def vector(self) -> list[float]:
        return [1.0, *(float(getattr(self, name)) for name in _FIELDS)]


_FIELDS = tuple(f.name for f in fields(StepFeatures))
FEATURE_NAMES = ("step", *_FIELDS)
# Features a profile saved before they existed lacks: read as 0, so it predicts as it did.
LATER_FEATURES = ("small_rows", "chunk_context")
SMALL_ROWS = 4
WIDTHS = (4, 8, 16, 32, 64)  # the upper ends of the batch-size bands a fit weighs alike


def features_of(batch: Iterable[tuple[int, int, bool, bool]]) -> StepFeatures:
    """Features of a batch of (num_computed_tokens, num_scheduled, is_prefill, samples) entries;
    `samples` is True when the entry reaches its last known token (a logits row)."""
    num = chunks = prefill = ctx = sampled = rows = chunk_ctx = 0
    attn = 0.0
    for computed, n, is_prefill, samples in batch:
        num += 1
        sampled += samples
        rows += n
        if is_prefill:
            if n > 1:  # a one-token chunk is attended with the decodes
                chunks += 1
                chunk_ctx += computed
            prefill += n
            attn += n * (computed + n / 2)
        else:
            ctx += computed + n
    return StepFeatures(num, chunks, prefill, attn, ctx, sampled, min(rows, SMALL_ROWS),
                        chunk_ctx)  # fmt: skip


@dataclass(frozen=True, slots=True)
class CostModel:
    """Step seconds = coefficients . [1, features]; plus the serving path's fixed latencies."""

    coefficients: tuple[float, ...]  # one per FEATURE_NAMES
    # Seconds from a step's end to the client seeing its tokens (delivery, SSE, parsing), and
    # from a request's send to the engine having it (HTTP, tokenizing, queueing into the loop).
    token_delivery_s: float = 0.0
    request_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.coefficients) != len(FEATURE_NAMES):
            raise EngineLiteError(
                f"a cost model needs {len(FEATURE_NAMES)} coefficients ({FEATURE_NAMES}), "
                f"got {len(self.coefficients)}"
            )

    def step_s(self, f: StepFeatures) -> float:
        # Written out, in `vector()`'s order and summed left to right as `sum()` would: the
        # simulator asks this once a step, and a virtual-time figure must not move by a bit.
        c = self.coefficients
        return (0 + c[0] * 1.0 + c[1] * f.num_reqs + c[2] * f.prefill_chunks
                + c[3] * f.prefill_tokens + c[4] * f.prefill_attn + c[5] * f.decode_context
                + c[6] * f.sampled + c[7] * f.small_rows
                + c[8] * f.chunk_context)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "coefficients": dict(zip(FEATURE_NAMES, self.coefficients, strict=True)),
            "token_delivery_s": self.token_delivery_s,
            "request_overhead_s": self.request_overhead_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostModel:
        try:
            given = data["coefficients"]
            coef = tuple(float(given[name] if name in given or name not in LATER_FEATURES
                               else 0.0) for name in FEATURE_NAMES)  # fmt: skip
            return cls(coef, float(data.get("token_delivery_s", 0.0)),
                       float(data.get("request_overhead_s", 0.0)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineLiteError(
                f"cost model is malformed ({exc}); it needs coefficients {FEATURE_NAMES}"
            ) from None


@dataclass(frozen=True, slots=True)
class FitReport:
    model: CostModel
    num_steps: int
    median_rel_error: float
    p90_rel_error: float


def fit(samples: Sequence[tuple[StepFeatures, float]], chunk_s: float | None = None,
        context_s: float = 0.0, **latencies: float) -> FitReport:  # fmt: skip
    """Non-negative least squares of step seconds on features, on relative error. With
    `chunk_s`, what one prefill chunk was measured to add to a step apart from its tokens
    (`engine_lite.probe`: the chunk and its request row), the rest is fitted around it;
    `context_s` is what a chunk pays per position cached before it, measured there too.
    Serving steps cannot tell that read from the chunk's attention, so it is never fitted:
    without a measurement it is 0."""
    if len(samples) < len(FEATURE_NAMES):
        raise EngineLiteError(
            f"{len(samples)} step samples cannot fit {len(FEATURE_NAMES)} coefficients; "
            "profile more steps"
        )
    x = np.array([f.vector() for f, _ in samples])
    y = np.array([s for _, s in samples], dtype=float)
    if not (y > 0).all():
        raise EngineLiteError("step durations must be positive; the profile is corrupt")
    w = _band_weights(x[:, _REQ]) / y  # relative error, per band
    coef = _pinned(x, y, w, chunk_s, context_s)
    model = CostModel(tuple(float(c) for c in coef), **latencies)
    rel = np.abs(x @ coef - y) / y
    return FitReport(model, len(y), float(np.median(rel)), float(np.quantile(rel, 0.9)))


def _band_weights(num_reqs: np.ndarray) -> np.ndarray:
    """Weights under which each band of batch sizes sums to the same squared weight."""
    band = np.searchsorted(WIDTHS, num_reqs)
    return 1.0 / np.sqrt(np.bincount(band)[band])


_REQ, _CHUNK = FEATURE_NAMES.index("num_reqs"), FEATURE_NAMES.index("prefill_chunks")
_CHUNK_CTX = FEATURE_NAMES.index("chunk_context")


def _pinned(x: np.ndarray, y: np.ndarray, w: np.ndarray, chunk_s: float | None,
            context_s: float) -> np.ndarray:  # fmt: skip
    """The fit with the chunk context's cost at `context_s` and, given `chunk_s`, a chunk's
    row and its own cost summing to `chunk_s`: the request cost is fitted on the other rows,
    the chunk's is what the probe measured beyond it."""
    rows, held = x.copy(), {_CHUNK_CTX: context_s}
    if chunk_s is not None:
        rows[:, _REQ] -= x[:, _CHUNK]  # rows that are not prefill chunks
        held[_CHUNK] = chunk_s
    coef = nnls_holding(rows, y, w, held)
    if chunk_s is not None:
        coef[_CHUNK] = max(0.0, chunk_s - coef[_REQ])
    return coef


def nnls_holding(a: np.ndarray, b: np.ndarray, w: np.ndarray,
                 held: dict[int, float]) -> np.ndarray:  # fmt: skip
    """Non-negative least squares of `a x = b` weighted by `w`, the columns in `held` fixed at
    their values (measured apart, or kept from a starting model) and the rest fitted around
    them."""
    target = b
    for i, value in held.items():
        target = target - value * a[:, i]
    free = [i for i in range(a.shape[1]) if i not in held]
    x = np.zeros(a.shape[1])
    x[free] = nnls(a[:, free] * w[:, None], target * w)
    for i, value in held.items():
        x[i] = value
    return x


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    # Columns are scaled to unit norm first: features span ten orders of magnitude.
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        grad = a.T @ (b - a @ x)
        if passive.all() or (grad[~passive] <= 1e-12).all():
            break
        passive[np.argmax(np.where(passive, -np.inf, grad))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x / scale
