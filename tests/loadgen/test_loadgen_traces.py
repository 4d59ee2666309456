"""Trace replay: the bundled Azure slice, Mooncake JSONL and our own JSONL."""

from __future__ import annotations

import csv
import itertools
import json

import pytest

from loadgen import LoadgenError, TraceRow, arrival_offsets, build_workload, read_trace
from loadgen.traces import DATA_DIR, write_trace_jsonl


def test_bundled_trace_merges_conv_and_code_by_time():
    wl = build_workload("trace", num_requests=None)
    assert len(wl.requests) == 1445 + 360
    ts = wl.timestamps_s
    assert ts[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(ts))
    assert 290 < ts[-1] < 300  # the first five minutes
    assert (DATA_DIR / "README.md").read_text().count("CC-BY 4.0") == 1


def test_bundled_trace_lengths_match_the_csv_rows():
    with (DATA_DIR / "azure_conv_2023_5min.csv").open() as fh:
        first = next(csv.DictReader(fh))  # the earliest request of both files
    wl = build_workload("trace", num_requests=3)
    assert wl.requests[0].prompt_len == int(first["ContextTokens"])
    assert wl.requests[0].output_len == int(first["GeneratedTokens"])


def test_slice_and_time_scale():
    full = build_workload("trace", num_requests=None)
    part = build_workload("trace", num_requests=10, trace_start=100)
    assert [r.prompt_len for r in part.requests] == [r.prompt_len for r in full.requests[100:110]]
    assert part.timestamps_s[0] == 0.0
    gaps = [
        b - a for a, b in zip(full.timestamps_s[100:110], full.timestamps_s[101:111], strict=True)
    ]
    slow = arrival_offsets("trace", None, 10, timestamps=part.timestamps_s, time_scale=2.0)
    assert slow[1:] == pytest.approx([2 * sum(gaps[:k]) for k in range(1, 10)])


def test_long_trace_prompts_are_clipped_to_the_context():
    wl = build_workload("trace", num_requests=None, max_model_len=2048)
    assert max(r.prompt_len + r.output_len for r in wl.requests) <= 2048


def test_mooncake_jsonl_keeps_shared_prefixes(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 250, "input_length": 1024, "output_length": 9, "hash_ids": [1, 3]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    wl = build_workload("trace", num_requests=None, trace_path=path)
    a, b = (r.prompt_token_ids for r in wl.requests)
    assert (len(a), len(b)) == (700, 1024)
    assert a[:512] == b[:512] and a[512:700] != b[512:700]
    assert wl.timestamps_s == [0.0, 0.25]
    assert [r.output_len for r in wl.requests] == [5, 9]


def test_own_jsonl_round_trips_exact_prompts(tmp_path):
    rows = [TraceRow(0.0, 3, 2, [10, 11, 12]), TraceRow(1.5, 4, 1, None)]
    path = write_trace_jsonl(rows, tmp_path / "own.jsonl")
    assert read_trace(path) == rows
    wl = build_workload("trace", num_requests=None, trace_path=path)
    assert wl.requests[0].prompt_token_ids == [10, 11, 12]
    assert wl.requests[1].prompt_len == 4


def test_azure_csv_file_by_path(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    wl = build_workload("trace", num_requests=None, trace_path=path)
    assert wl.timestamps_s == pytest.approx([0.0, 4.314579])
    assert [r.prompt_len for r in wl.requests] == [374, 396]


@pytest.mark.parametrize(
    ("content", "suffix", "named"),
    [
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", ".csv", "t.csv:2"),
        ('{"timestamp": 0, "input_length": "many"}\n', ".jsonl", "t.jsonl:1"),
        ("not json\n", ".txt", "--trace-format"),
        ("", ".jsonl", "no requests"),
    ],
)
def test_malformed_traces_name_the_file_and_line(tmp_path, content, suffix, named):
    path = tmp_path / f"t{suffix}"
    path.write_text(content)
    with pytest.raises(LoadgenError, match=named):
        build_workload("trace", num_requests=None, trace_path=path)


def test_missing_file_and_bad_slice():
    with pytest.raises(LoadgenError, match="does not exist"):
        build_workload("trace", trace_path="/nonexistent/trace.csv")
    with pytest.raises(LoadgenError, match="trace start 99999"):
        build_workload("trace", trace_start=99999)
    with pytest.raises(LoadgenError, match="'xml'"):
        build_workload("trace", trace_path=DATA_DIR / "README.md", trace_format="xml")
