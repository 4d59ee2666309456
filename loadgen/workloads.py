"""Workloads: the requests of a preset, a `random` spec or a trace, with a stable fingerprint."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen import presets, traces
from loadgen.errors import LoadgenError
from loadgen.trace_fit import OnLong, fit_to_context

# Token ids 0..3 are special in most vocabularies (pad/bos/eos/unk); prompts avoid them.
FIRST_PROMPT_TOKEN_ID = 4
DEFAULT_VOCAB_SIZE = 4096  # the `tiny` preset's; any larger vocabulary accepts these ids too
MAX_LENGTH_SCALE = 1e4
WORKLOADS = ("chat", "code", "rag", "summarize", "agent", "mixed", "random", "trace")


@dataclass(slots=True)
class RequestSpec:
    """One request to send: exact prompt token ids and the output length to force."""

    index: int
    prompt_token_ids: list[int]
    output_len: int
    class_name: str  # "short" | "long" (prompt longer than the workload's threshold)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(slots=True)
class Workload:
    """A named request list; `timestamps_s` are the arrival times when it came from a trace."""

    name: str
    requests: list[RequestSpec]
    max_model_len: int
    vocab_size: int
    long_prompt_threshold: int
    timestamps_s: list[float] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    # What the user should hear about how the workload was built (rows clipped or skipped).
    notes: list[str] = field(default_factory=list)

    def fingerprint(self) -> str:
        """Stable hash of the request list (prompts, output lengths, classes, order)."""
        h = hashlib.sha256()
        for r in self.requests:
            h.update(f"{r.index}:{r.output_len}:{r.class_name}:{r.prompt_len};".encode())
            h.update(np.asarray(r.prompt_token_ids, dtype=np.int64).tobytes())
        return h.hexdigest()[:16]

    def class_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.requests:
            counts[r.class_name] = counts.get(r.class_name, 0) + 1
        return counts


def build_workload(
    name: str = "mixed",
    num_requests: int | None = 200,
    seed: int = 0,
    max_model_len: int = presets.REFERENCE_MODEL_LEN,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float = 0.0,
    trace_path: str | Path | None = None,
    trace_format: str | None = None,
    trace_start: int = 0,
    length_scale: float | None = None,
    long_prompt_threshold: int | None = None,
    on_long: str = OnLong.CLIP,
) -> Workload:
    """Build a workload; the same arguments give the identical request list (and fingerprint).

    `random` draws lengths uniformly from vLLM's range-ratio convention,
    U[L(1-r), L(1+r)] inclusive (vllm/benchmarks/datasets.py `RandomDataset`).
    `trace` replays the bundled Azure slice, or `trace_path` (Azure CSV, Mooncake JSONL or our
    JSONL) from row `trace_start`; `num_requests=None` takes every remaining row. Rows longer
    than `max_model_len` are clipped, skipped or refused as `on_long` says (see `OnLong`), and
    `notes` counts them.
    """
    _check_common(name, seed, num_requests, max_model_len, vocab_size, length_scale)
    scale = presets.length_scale_for(max_model_len) if length_scale is None else length_scale
    threshold = long_prompt_threshold or max(1, max_model_len // 8)
    rng = np.random.default_rng(seed)
    wl = Workload(name, [], max_model_len, vocab_size, threshold, params={"seed": seed})
    if name in presets.PRESETS:
        n = _need_count(name, num_requests)
        p_arr, o_arr = presets.sample_lengths(presets.PRESETS[name], rng, n, scale)
        _fill(wl, rng, p_arr.tolist(), o_arr.tolist())
    elif name == "agent":
        _fill_agent(wl, rng, _need_count(name, num_requests), scale)
    elif name == "random":
        n = _need_count(name, num_requests)
        prompts, outputs = random_lengths(rng, n, input_len, output_len, range_ratio)
        wl.params.update(input_len=input_len, output_len=output_len, range_ratio=range_ratio)
        _fill(wl, rng, prompts, outputs)
    else:
        _fill_trace(
            wl, rng, trace_path, trace_format, trace_start, num_requests, length_scale, on_long
        )
    return wl


def random_lengths(
    rng: np.random.Generator, n: int, input_len: int, output_len: int, range_ratio: float
) -> tuple[list[int], list[int]]:
    """vLLM's `random` lengths: each uniform on [int(L(1-r)), int(L(1+r))], at least 1."""
    if not 0.0 <= range_ratio < 1.0:
        raise LoadgenError(f"range_ratio={range_ratio!r} is invalid; use 0 <= range_ratio < 1")
    for label, value in (("input_len", input_len), ("output_len", output_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LoadgenError(f"{label}={value!r} is invalid; use an integer >= 1")

    def draw(length: int) -> list[int]:
        lo, hi = int(length * (1 - range_ratio)), int(length * (1 + range_ratio))
        return np.maximum(rng.integers(lo, hi + 1, size=n), 1).tolist()

    return draw(input_len), draw(output_len)


def _fill(
    wl: Workload,
    rng: np.random.Generator,
    prompt_lens: list[int],
    output_lens: list[int],
    given_ids: list[list[int] | None] | None = None,
) -> None:
    for i, (p_len, o_len) in enumerate(zip(prompt_lens, output_lens, strict=True)):
        o_len = min(int(o_len), wl.max_model_len - 1)
        p_len = max(1, min(int(p_len), wl.max_model_len - o_len))
        ids = given_ids[i] if given_ids is not None else None
        ids = ids[:p_len] if ids else _token_ids(rng, p_len, wl.vocab_size)
        wl.requests.append(RequestSpec(i, ids, o_len, _class_of(len(ids), wl)))


def _fill_trace(
    wl: Workload,
    rng: np.random.Generator,
    path: str | Path | None,
    fmt: str | None,
    start: int,
    count: int | None,
    length_scale: float | None,
    on_long: str,
) -> None:
    rows = traces.load_trace(path, fmt, start, count)
    fit = fit_to_context(rows, wl.max_model_len, on_long, length_scale or 1.0)
    _fill(wl, rng, fit.prompt_lens, fit.output_lens, [r.prompt_token_ids for r in fit.rows])
    wl.timestamps_s = [r.timestamp_s for r in fit.rows]
    wl.params.update(
        trace=str(path or traces.BUNDLED_TRACE_NAME),
        start=start,
        on_long=str(fit.on_long),
        rows_too_long=fit.num_long,
    )
    wl.notes += [note] if (note := fit.note()) else []


def _fill_agent(wl: Workload, rng: np.random.Generator, n: int, scale: float) -> None:
    """Interleave sessions at random while keeping each session's turns in order."""
    sessions = presets.agent_sessions(rng, n, scale, wl.max_model_len)
    contexts: dict[int, list[int]] = {sid: [] for sid, _ in sessions}
    pending = {sid: list(turns) for sid, turns in sessions}
    while pending:
        sid = list(pending)[int(rng.integers(len(pending)))]
        added, out = pending[sid].pop(0)
        contexts[sid] = contexts[sid] + _token_ids(rng, added, wl.vocab_size)
        ids = contexts[sid][: wl.max_model_len - out]
        wl.requests.append(RequestSpec(len(wl.requests), ids, out, _class_of(len(ids), wl)))
        if not pending[sid]:
            del pending[sid]
    wl.params["sessions"] = len(sessions)


def _token_ids(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    return rng.integers(FIRST_PROMPT_TOKEN_ID, vocab_size, size=n).tolist()


def _class_of(prompt_len: int, wl: Workload) -> str:
    return "long" if prompt_len > wl.long_prompt_threshold else "short"


def _need_count(name: str, num_requests: int | None) -> int:
    if num_requests is None:
        raise LoadgenError(f"workload {name!r} needs num_requests; pass an integer >= 1")
    return num_requests


def _check_common(
    name: str,
    seed: int,
    num_requests: int | None,
    max_model_len: int,
    vocab_size: int,
    length_scale: float | None,
) -> None:
    if name not in WORKLOADS:
        raise LoadgenError(f"unknown workload {name!r}; use one of {', '.join(WORKLOADS)}")
    if num_requests is not None and (isinstance(num_requests, bool) or num_requests < 1):
        raise LoadgenError(f"num_requests={num_requests!r} is invalid; use an integer >= 1")
    if max_model_len < 2:
        raise LoadgenError(f"max_model_len={max_model_len!r} is invalid; use an integer >= 2")
    if vocab_size <= FIRST_PROMPT_TOKEN_ID:
        raise LoadgenError(
            f"vocab_size={vocab_size!r} is too small; use more than {FIRST_PROMPT_TOKEN_ID}"
        )
    # Past 10^4 every length is clipped to the context anyway, and far past it (1e300) the
    # scaled lengths overflow int64 and came out negative.
    if length_scale is not None and not 0 < length_scale <= MAX_LENGTH_SCALE:
        raise LoadgenError(
            f"length_scale={length_scale!r} is invalid; use a number in (0, {MAX_LENGTH_SCALE:g}]"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise LoadgenError(f"seed={seed!r} is invalid; use an integer >= 0")
