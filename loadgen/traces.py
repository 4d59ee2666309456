"""Trace readers: Azure LLM inference CSV, Mooncake JSONL and our own JSONL, to `TraceRow`s."""

from __future__ import annotations

import csv
import enum
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.errors import LoadgenError

DATA_DIR = Path(__file__).resolve().parent / "data"
# The bundled `trace` workload: the first five minutes of the Azure LLM inference trace 2023,
# conversation and code services merged by time (CC-BY 4.0; attribution in data/README.md).
BUNDLED_TRACE_NAME = "azure-2023-conv+code-5min"
BUNDLED_TRACE_FILES = ("azure_conv_2023_5min.csv", "azure_code_2023_5min.csv")
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids name 512-token prompt blocks


class TraceFormat(enum.StrEnum):
    AZURE = "azure"  # TIMESTAMP,ContextTokens,GeneratedTokens
    MOONCAKE = "mooncake"  # {"timestamp": ms, "input_length", "output_length", "hash_ids"?}
    JSONL = "jsonl"  # {"timestamp_s"?, "input_len", "output_len", "prompt_token_ids"?}


@dataclass(slots=True, frozen=True)
class TraceRow:
    """One traced request; `timestamp_s` is relative to the trace's first row."""

    timestamp_s: float
    input_len: int
    output_len: int
    prompt_token_ids: list[int] | None = None


def load_trace(
    path: str | Path | None, fmt: str | None, start: int = 0, count: int | None = None
) -> list[TraceRow]:
    """Rows [start, start+count) of a trace (the bundled one when `path` is None), by time."""
    if path is None:
        rows = sorted(
            (r for name in BUNDLED_TRACE_FILES for r in read_azure_csv(DATA_DIR / name)),
            key=lambda r: r.timestamp_s,
        )
    else:
        rows = read_trace(path, fmt)
    if start < 0 or start >= len(rows):
        raise LoadgenError(f"trace start {start} is outside the trace's {len(rows)} rows")
    picked = rows[start:] if count is None else rows[start : start + count]
    t0 = picked[0].timestamp_s
    return [
        TraceRow(r.timestamp_s - t0, r.input_len, r.output_len, r.prompt_token_ids) for r in picked
    ]


def read_trace(path: str | Path, fmt: str | None = None) -> list[TraceRow]:
    """Read a trace file; the format comes from `fmt` or, if None, from the file itself."""
    path = Path(path)
    if not path.is_file():
        raise LoadgenError(f"trace file {str(path)!r} does not exist; pass a readable file")
    kind = _format(path, fmt)
    rows = read_azure_csv(path) if kind is TraceFormat.AZURE else _read_jsonl(path, kind)
    if not rows:
        raise LoadgenError(f"trace file {str(path)!r} has no requests; pass a non-empty trace")
    return rows


def read_azure_csv(path: Path) -> list[TraceRow]:
    """Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens` per request."""
    rows = []
    with path.open(newline="", encoding="utf-8") as fh:
        for lineno, rec in enumerate(csv.DictReader(fh), start=2):
            try:
                ts = _azure_time_s(rec["TIMESTAMP"])
                rows.append(TraceRow(ts, int(rec["ContextTokens"]), int(rec["GeneratedTokens"])))
            except (KeyError, TypeError, ValueError):
                raise LoadgenError(
                    f"{path.name}:{lineno} is not an Azure trace row; expected columns "
                    "TIMESTAMP,ContextTokens,GeneratedTokens"
                ) from None
    return rows


def write_trace_jsonl(rows: list[TraceRow], path: str | Path) -> Path:
    """Write rows in our own JSONL format (with token ids when the rows carry them)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for r in rows:
            obj: dict[str, Any] = {"timestamp_s": r.timestamp_s, "input_len": r.input_len}
            obj["output_len"] = r.output_len
            if r.prompt_token_ids is not None:
                obj["prompt_token_ids"] = r.prompt_token_ids
            fh.write(json.dumps(obj) + "\n")
    return path


def _azure_time_s(text: str) -> float:
    # `2023-11-16 18:15:46.6805900`: seven fractional digits, more than strptime's %f takes.
    base, _, frac = text.strip().partition(".")
    dt = datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return dt.timestamp() + (float("0." + frac) if frac else 0.0)


def _format(path: Path, fmt: str | None) -> TraceFormat:
    if fmt is not None:
        try:
            return TraceFormat(fmt)
        except ValueError:
            names = ", ".join(f.value for f in TraceFormat)
            raise LoadgenError(f"trace format {fmt!r} is unknown; use one of {names}") from None
    if path.suffix.lower() == ".csv":
        return TraceFormat.AZURE
    with path.open(encoding="utf-8") as fh:
        first = fh.readline()
    if not first.strip():
        return TraceFormat.JSONL  # empty: read_trace says it has no requests
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        raise LoadgenError(
            f"trace file {path.name!r} is neither CSV nor JSONL; pass --trace-format"
        ) from None
    return TraceFormat.MOONCAKE if "input_length" in obj else TraceFormat.JSONL


def _read_jsonl(path: Path, kind: TraceFormat) -> list[TraceRow]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rows.append(_mooncake_row(obj) if kind is TraceFormat.MOONCAKE else _own_row(obj))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                want = (
                    "timestamp (ms), input_length, output_length"
                    if kind is TraceFormat.MOONCAKE
                    else "input_len, output_len (timestamp_s, prompt_token_ids optional)"
                )
                raise LoadgenError(
                    f"{path.name}:{lineno} is not a {kind} row; expected {want}"
                ) from None
    return rows


def _mooncake_row(obj: dict[str, Any]) -> TraceRow:
    n_in = int(obj["input_length"])
    ids = _mooncake_prompt(obj["hash_ids"], n_in) if obj.get("hash_ids") else None
    return TraceRow(float(obj["timestamp"]) / 1e3, n_in, int(obj["output_length"]), ids)


def _mooncake_prompt(hash_ids: list[int], n_tokens: int) -> list[int]:
    """Equal hash ids give equal 512-token blocks, so the trace's shared prefixes stay shared."""
    ids: list[int] = []
    for h in hash_ids:
        ids += np.random.default_rng(int(h)).integers(4, 4096, MOONCAKE_BLOCK_TOKENS).tolist()
    return ids[:n_tokens] if len(ids) >= n_tokens else ids + [4] * (n_tokens - len(ids))


def _own_row(obj: dict[str, Any]) -> TraceRow:
    ids = obj.get("prompt_token_ids")
    n_in = int(obj["input_len"]) if "input_len" in obj else len(ids or [])
    if n_in < 1:
        raise ValueError("input_len")
    ids = [int(t) for t in ids] if ids else None
    return TraceRow(float(obj.get("timestamp_s", 0.0)), n_in, int(obj["output_len"]), ids)
