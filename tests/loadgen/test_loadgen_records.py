"""Records survive a trip through pandas and a JSONL file, and slo reads them as they are."""

from __future__ import annotations

import math

import pandas as pd

from loadgen import (
    RequestRecord,
    read_records_jsonl,
    records_from_dataframe,
    records_to_dataframe,
    write_records_jsonl,
)
from slo import compute_metrics


def _records() -> list[RequestRecord]:
    ok = RequestRecord(0, "short", 10, 3, 5.0, 5.001, [5.1, 5.2], [1, 2], 10, 3, True, None)
    ok.finished_s = 5.21
    bad = RequestRecord(1, "long", 2000, 8, 5.5, 5.5)
    bad.fail("HTTP 503:\n  overloaded", 5.6)
    never = RequestRecord(2, "short", 5, 5, 6.0, warmup=True)  # never sent: NaN times
    return [ok, bad, never]


def test_jsonl_round_trip_is_exact_and_pandas_reads_it(tmp_path):
    recs = _records()
    path = write_records_jsonl(recs, tmp_path / "records.jsonl")
    back = read_records_jsonl(path)
    assert back[:2] == recs[:2]
    assert math.isnan(back[2].sent_s) and back[2].warmup
    df = pd.read_json(path, lines=True)
    assert list(df["chunk_tokens"][0]) == [1, 2]
    assert df["error"][1] == "HTTP 503: overloaded"  # one line


def test_dataframe_round_trip():
    recs = _records()
    df = records_to_dataframe(recs)
    assert len(df) == 3 and df["success"].tolist() == [True, False, False]
    assert records_from_dataframe(df)[:2] == recs[:2]


def test_slo_reads_records_directly():
    m = compute_metrics(_records())
    assert (m.completed, m.failed) == (1, 1)
    assert m.mean_ttft_s == 5.1 - 5.001
    assert m.duration_s == 5.6 - 5.001  # the failure ended last
