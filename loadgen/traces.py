"""Trace readers: Azure LLM inference CSV, Mooncake JSONL and our own JSONL, to `TraceRow`s."""

from __future__ import annotations

import csv
import enum
import io
import itertools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from loadgen import trace_fields as tf
from loadgen.arrivals import MAX_SCHEDULE_S
from loadgen.errors import LoadgenError

DATA_DIR = Path(__file__).resolve().parent / "data"
# The bundled `trace` workload: the first five minutes of the Azure LLM inference trace 2023,
# conversation and code services merged by time (CC-BY 4.0; attribution in data/README.md).
BUNDLED_TRACE_NAME = "azure-2023-conv+code-5min"
BUNDLED_TRACE_FILES = ("azure_conv_2023_5min.csv", "azure_code_2023_5min.csv")
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids name 512-token prompt blocks
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceFormat(enum.StrEnum):
    AZURE = "azure"  # TIMESTAMP,ContextTokens,GeneratedTokens
    MOONCAKE = "mooncake"  # {"timestamp": ms, "input_length", "output_length", "hash_ids"?}
    JSONL = "jsonl"  # {"timestamp_s"?, "input_len", "output_len", "prompt_token_ids"?}


@dataclass(slots=True, frozen=True)
class TraceRow:
    """One traced request; `timestamp_s` is relative to the trace's first row.

    `source` (`file:line`) lets later checks name the row; it takes no part in equality.
    """

    timestamp_s: float
    input_len: int
    output_len: int
    prompt_token_ids: list[int] | None = None
    source: str = field(default="", compare=False)


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
    _check_timeline(picked)
    t0 = picked[0].timestamp_s
    return [
        TraceRow(r.timestamp_s - t0, r.input_len, r.output_len, r.prompt_token_ids, r.source)
        for r in picked
    ]


def read_trace(path: str | Path, fmt: str | None = None) -> list[TraceRow]:
    """Read a trace file; the format comes from `fmt` or, if None, from the file itself."""
    path = Path(path)
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "does not exist"
        raise LoadgenError(f"trace file {str(path)!r} {what}; pass a readable file")
    text = tf.read_text(path)
    kind = _format(path, fmt, text)
    if kind is TraceFormat.AZURE:
        rows = _read_azure_text(path.name, text)
    else:
        rows = _read_jsonl_text(path.name, text, kind)
    if not rows:
        raise LoadgenError(f"trace file {str(path)!r} has no requests; pass a non-empty trace")
    return rows


def read_azure_csv(path: Path) -> list[TraceRow]:
    """Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens` per request."""
    return _read_azure_text(path.name, tf.read_text(path))


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


def _check_timeline(rows: list[TraceRow]) -> None:
    # A trace is replayed in real time: a row out of order, or one timestamp in the wrong
    # unit or corrupt (1e300), would otherwise hang the replay instead of failing here.
    t0 = rows[0].timestamp_s
    for prev, row in itertools.pairwise(rows):
        if row.timestamp_s < prev.timestamp_s:
            raise LoadgenError(
                f"{row.source} is earlier than the row before it ({prev.source}); "
                "sort the trace by time"
            )
        if row.timestamp_s - t0 > MAX_SCHEDULE_S:
            raise LoadgenError(
                f"{row.source} is {row.timestamp_s - t0:.3g} s after the first row, past the "
                f"{MAX_SCHEDULE_S / 86400:g}-day limit of a replay; fix its timestamp (wrong "
                "unit?) or pick rows with --slice"
            )


def _read_azure_text(name: str, text: str) -> list[TraceRow]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise LoadgenError(
            f"{name}:1 has no column {', '.join(missing)}; an Azure trace has the columns "
            f"{','.join(AZURE_COLUMNS)}"
        )
    rows = []
    try:
        for rec in reader:
            rows.append(_azure_row(rec, f"{name}:{reader.line_num}"))
    except csv.Error as exc:
        raise LoadgenError(f"{name}:{reader.line_num} is not CSV ({exc})") from None
    return rows


def _azure_row(rec: dict[str, Any], where: str) -> TraceRow:
    return TraceRow(
        _azure_time_s(rec["TIMESTAMP"], where),
        tf.token_count(rec["ContextTokens"], "ContextTokens", where),
        tf.token_count(rec["GeneratedTokens"], "GeneratedTokens", where),
        source=where,
    )


def _azure_time_s(text: Any, where: str) -> float:
    # `2023-11-16 18:15:46.6805900`: seven fractional digits, more than strptime's %f takes.
    try:
        base, _, frac = str(text).strip().partition(".")
        dt = datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        return dt.timestamp() + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise LoadgenError(
            f"{where} TIMESTAMP={tf.echo(text)} is not a time; write it like "
            "2023-11-16 18:15:46.6805900"
        ) from None


def _format(path: Path, fmt: str | None, text: str) -> TraceFormat:
    if fmt is not None:
        try:
            return TraceFormat(fmt)
        except ValueError:
            names = ", ".join(f.value for f in TraceFormat)
            raise LoadgenError(f"trace format {fmt!r} is unknown; use one of {names}") from None
    if path.suffix.lower() == ".csv":
        return TraceFormat.AZURE
    first = text.split("\n", 1)[0]
    if not first.strip():
        return TraceFormat.JSONL  # empty: read_trace says it has no requests
    try:
        obj = json.loads(first)
    except ValueError:
        raise LoadgenError(
            f"trace file {path.name!r} is neither CSV nor JSONL; pass --trace-format"
        ) from None
    return (
        TraceFormat.MOONCAKE
        if isinstance(obj, dict) and "input_length" in obj
        else (TraceFormat.JSONL)
    )


def _read_jsonl_text(name: str, text: str, kind: TraceFormat) -> list[TraceRow]:
    rows = []
    # Split on newlines only: str.splitlines() also breaks at U+2028, which JSON strings may hold.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise LoadgenError(f"{where} is not JSON; write one JSON object per line") from None
        if not isinstance(obj, dict):
            raise LoadgenError(
                f"{where} is a JSON {type(obj).__name__}, not an object; a {kind} row looks "
                f"like {_EXAMPLE_ROW[kind]}"
            )
        rows.append(
            _mooncake_row(obj, where) if kind is TraceFormat.MOONCAKE else _own_row(obj, where)
        )
    return rows


_EXAMPLE_ROW = {
    TraceFormat.MOONCAKE: '{"timestamp": 0, "input_length": 700, "output_length": 5}',
    TraceFormat.JSONL: '{"timestamp_s": 0.0, "input_len": 700, "output_len": 5}',
}


def _required(obj: dict[str, Any], name: str, where: str, kind: TraceFormat) -> Any:
    if name not in obj:
        raise LoadgenError(f"{where} has no {name}; a {kind} row looks like {_EXAMPLE_ROW[kind]}")
    return obj[name]


def _mooncake_row(obj: dict[str, Any], where: str) -> TraceRow:
    kind = TraceFormat.MOONCAKE
    n_in = tf.token_count(_required(obj, "input_length", where, kind), "input_length", where)
    n_out = tf.token_count(_required(obj, "output_length", where, kind), "output_length", where)
    ts = tf.timestamp(_required(obj, "timestamp", where, kind), "timestamp", where, 1e3)
    hashes = obj.get("hash_ids")
    ids = _mooncake_prompt(tf.token_ids(hashes, "hash_ids", where), n_in) if hashes else None
    return TraceRow(ts, n_in, n_out, ids, where)


def _mooncake_prompt(hash_ids: list[int], n_tokens: int) -> list[int]:
    """Equal hash ids give equal 512-token blocks, so the trace's shared prefixes stay shared."""
    ids: list[int] = []
    for h in hash_ids[: -(-n_tokens // MOONCAKE_BLOCK_TOKENS)]:  # only the blocks it needs
        ids += np.random.default_rng(h).integers(4, 4096, MOONCAKE_BLOCK_TOKENS).tolist()
    return ids[:n_tokens] if len(ids) >= n_tokens else ids + [4] * (n_tokens - len(ids))


def _own_row(obj: dict[str, Any], where: str) -> TraceRow:
    kind = TraceFormat.JSONL
    given = obj.get("prompt_token_ids")
    ids = None if given is None else tf.token_ids(given, "prompt_token_ids", where)
    if "input_len" in obj or ids is None:
        n_in = tf.token_count(_required(obj, "input_len", where, kind), "input_len", where)
        if ids is not None and n_in != len(ids):
            raise LoadgenError(
                f"{where} input_len={n_in} but prompt_token_ids holds {len(ids)} ids; "
                "make them agree or drop input_len"
            )
    else:
        n_in = len(ids)
    n_out = tf.token_count(_required(obj, "output_len", where, kind), "output_len", where)
    ts = tf.timestamp(obj.get("timestamp_s", 0.0), "timestamp_s", where)
    return TraceRow(ts, n_in, n_out, ids, where)
