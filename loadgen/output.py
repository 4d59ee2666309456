"""`loadgen --out DIR`: checked writable before anything is measured, written after the run."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from loadgen.errors import LoadgenError
from loadgen.records import RequestRecord
from loadgen.report import record_rows
from loadgen.runner import ReplayResult

RESULT_FILE = "result.json"
RECORDS_FILE = "records.jsonl"


def prepare_out_dir(given: str) -> None:
    """Creates the `--out` folder and proves a file can be written there, so a run is never
    measured only to be lost: a path under a file, a read-only folder or a full disk fails
    here, at once."""
    if not given.strip():
        raise LoadgenError("--out '' is empty; name a folder for records.jsonl and result.json")
    out = Path(given)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in (RESULT_FILE, RECORDS_FILE):
            if (out / name).is_dir():
                raise IsADirectoryError(21, "Is a directory", str(out / name))
        fd, probe = tempfile.mkstemp(dir=out, prefix=".loadgen-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LoadgenError(
            f"--out {str(out)!r} is not writable ({_reason(exc)}); pick a folder you can write to"
        ) from None


def write_out(out: Path, res: ReplayResult, result: dict[str, Any]) -> None:
    """`records.jsonl` (raw records plus derived latencies) and `result.json` in `out`."""
    derived = {row["index"]: row for row in record_rows(res.records)}
    try:
        with (out / RECORDS_FILE).open("w", encoding="utf-8") as fh:
            for rec in res.records:
                row = {**dataclasses.asdict(rec), **derived.get(rec.index, {})}
                fh.write(json.dumps(_json_row(rec, row)) + "\n")
        text = json.dumps(result, indent=2) + "\n"
        (out / RESULT_FILE).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise LoadgenError(
            f"could not write the run to --out {str(out)!r} ({_reason(exc)}); the result "
            "printed above is the only copy"
        ) from None


def _json_row(rec: RequestRecord, row: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }


def _reason(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or type(exc).__name__}{where}"
