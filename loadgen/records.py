"""`RequestRecord`: what one replayed request measured, and its round trip through pandas."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it; times are `time.monotonic()` seconds.

    `chunk_times_s[i]` is when the i-th token-bearing chunk arrived and `chunk_tokens[i]` how
    many tokens it carried. `prompt_tokens` / `output_tokens` come from the server's usage
    report (0 when it sent none). A failed request keeps what it received before failing.
    """

    index: int
    class_name: str
    prompt_len: int
    output_len: int
    scheduled_s: float
    sent_s: float = math.nan
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    success: bool = False
    error: str | None = None
    warmup: bool = False
    finished_s: float = math.nan  # when the request ended, successful or not

    def fail(self, reason: str, now_s: float) -> None:
        """Mark the request failed with a one-line reason."""
        self.success = False
        self.error = " ".join(reason.split()) or "unknown error"
        self.finished_s = now_s


RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))


def records_to_dataframe(records: list[RequestRecord]) -> pd.DataFrame:
    """One row per request; list columns stay lists."""
    import pandas as pd

    return pd.DataFrame([dataclasses.asdict(r) for r in records], columns=list(RECORD_FIELDS))


def records_from_dataframe(df: pd.DataFrame) -> list[RequestRecord]:
    """The inverse of `records_to_dataframe` (extra columns are ignored)."""
    out = []
    for row in df.to_dict(orient="records"):
        kw: dict[str, Any] = {k: row[k] for k in RECORD_FIELDS if k in row}
        kw["chunk_times_s"] = [float(t) for t in kw.get("chunk_times_s") or []]
        kw["chunk_tokens"] = [int(t) for t in kw.get("chunk_tokens") or []]
        err = kw.get("error")
        kw["error"] = None if err is None or (isinstance(err, float) and math.isnan(err)) else err
        for name in ("index", "prompt_len", "output_len", "prompt_tokens", "output_tokens"):
            kw[name] = int(kw[name])
        kw["success"], kw["warmup"] = bool(kw["success"]), bool(kw["warmup"])
        out.append(RequestRecord(**kw))
    return out


def write_records_jsonl(records: list[RequestRecord], path: str | Path) -> Path:
    """Write one JSON object per line; `pandas.read_json(path, lines=True)` reads it back."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(_jsonable(dataclasses.asdict(r))) + "\n")
    return path


def read_records_jsonl(path: str | Path) -> list[RequestRecord]:
    import pandas as pd

    return records_from_dataframe(pd.read_json(path, lines=True, dtype=False))


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    # NaN is not JSON; a request that never got sent or never ended stores null.
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
