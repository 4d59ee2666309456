"""Trace replay: the bundled Azure slice, Mooncake JSONL and our own JSONL."""

from __future__ import annotations

import csv
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _trace(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(
    ("name", "content", "named"),
    [
        # A timestamp nobody could mean: the replay would have slept until killed.
        (
            "t.jsonl",
            '{"input_len": 5, "output_len": 2}\n{"timestamp_s": 1e300, '
            '"input_len": 5, "output_len": 2}\n',
            "t.jsonl:2 is 1e+300 s after the first row",
        ),
        (
            "t.jsonl",
            '{"timestamp_s": NaN, "input_len": 5, "output_len": 2}\n',
            "t.jsonl:1 timestamp_s=nan is not a time",
        ),
        (
            "t.jsonl",
            '{"timestamp_s": 2, "input_len": 5, "output_len": 2}\n'
            '{"timestamp_s": 1, "input_len": 5, "output_len": 2}\n',
            "t.jsonl:2 is earlier",
        ),
        (
            "t.jsonl",
            b'{"input_len": 5, "output_len": 2}\n{"input_len": "\xff"}\n',
            "t.jsonl:2 is not UTF-8 text (byte 0xff)",
        ),
        ("t.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xe9,1,1\n", "t.csv:2 is not UTF-8"),
        ("t.jsonl", '{"input_len": 5, "output_len": 2}\n[1,2,3]\n', "t.jsonl:2 is a JSON list"),
        ("t.txt", "[1,2,3]\n", "t.txt:1 is a JSON list"),
        ("t.jsonl", "7\n", "t.jsonl:1 is a JSON int"),
        # Negative or zero lengths are broken rows in every format, not silently 1.
        ("t.csv", AZURE_HEAD + "2023-11-16 18:15:46.6805900,-5,3\n", "t.csv:2 ContextTokens='-5'"),
        ("t.csv", AZURE_HEAD + "2023-11-16 18:15:46.6805900,5,0\n", "t.csv:2 GeneratedTokens='0'"),
        (
            "t.jsonl",
            '{"timestamp": 0, "input_length": -3, "output_length": 2}\n',
            "t.jsonl:1 input_length=-3",
        ),
        (
            "t.jsonl",
            '{"timestamp": 0, "input_length": 3, "output_length": -2}\n',
            "t.jsonl:1 output_length=-2",
        ),
        ("t.jsonl", '{"input_len": 3, "output_len": -1}\n', "t.jsonl:1 output_len=-1"),
        ("t.jsonl", '{"input_len": 0, "output_len": 1}\n', "t.jsonl:1 input_len=0"),
        ("t.jsonl", '{"input_len": 1e300, "output_len": 1}\n', "t.jsonl:1 input_len=1e+300"),
        (
            "t.jsonl",
            '{"input_len": 2, "output_len": 1, "prompt_token_ids": [5, 6, 7]}\n',
            "input_len=2 but prompt_token_ids holds 3 ids",
        ),
        (
            "t.jsonl",
            '{"output_len": 1, "prompt_token_ids": [5, -6]}\n',
            "prompt_token_ids holds -6",
        ),
        ("t.jsonl", '{"timestamp": 0, "input_length": 3}\n', "t.jsonl:1 has no output_length"),
        ("t.csv", "TIMESTAMP,Context\n1,2\n", "t.csv:1 has no column ContextTokens"),
    ],
)
def test_bad_trace_rows_name_file_line_and_field(tmp_path, name, content, named):
    path = _trace(tmp_path, name, content)
    with pytest.raises(LoadgenError) as err:
        build_workload("trace", num_requests=None, trace_path=path)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_utf8_bom_is_not_part_of_the_first_column(tmp_path):
    path = _trace(tmp_path, "t.csv", "\ufeff" + AZURE_HEAD + "2023-11-16 18:15:46.6805900,5,3\n")
    assert [r.prompt_len for r in build_workload("trace", trace_path=path).requests] == [5]


def _mooncake_with_long_rows(tmp_path):
    rows = [
        {"timestamp": 100 * i, "input_length": 5000 if i % 3 == 0 else 300, "output_length": 20}
        for i in range(9)
    ]
    return _trace(tmp_path, "mc.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def test_long_rows_are_clipped_by_default_and_counted(tmp_path):
    path = _mooncake_with_long_rows(tmp_path)
    wl = build_workload("trace", num_requests=None, trace_path=path, max_model_len=1024)
    assert len(wl.requests) == 9
    assert max(r.prompt_len + r.output_len for r in wl.requests) <= 1024
    assert wl.notes == [
        "3 of 9 trace rows are longer than max_model_len 1024 (prompt + output) and had their "
        "prompts cut to fit (--on-long clip; skip drops them, error stops at the first)"
    ]
    assert wl.params["rows_too_long"] == 3


def test_long_rows_can_be_skipped_or_refused(tmp_path):
    path = _mooncake_with_long_rows(tmp_path)
    wl = build_workload("trace", trace_path=path, max_model_len=1024, on_long="skip")
    assert [r.prompt_len for r in wl.requests] == [300] * 6
    assert wl.timestamps_s[0] == 0.1 and "were skipped" in wl.notes[0]
    with pytest.raises(LoadgenError, match=r"mc.jsonl:1 has prompt 5000 \+ output 20"):
        build_workload("trace", trace_path=path, max_model_len=1024, on_long="error")
    with pytest.raises(LoadgenError, match="all 9 trace rows"):
        build_workload("trace", trace_path=path, max_model_len=100, on_long="skip")
    with pytest.raises(LoadgenError, match="on_long='drop' is unknown"):
        build_workload("trace", trace_path=path, on_long="drop")


def test_rows_that_fit_leave_no_note(tmp_path):
    path = _mooncake_with_long_rows(tmp_path)
    wl = build_workload("trace", trace_path=path, max_model_len=8192, on_long="error")
    assert wl.notes == [] and wl.params["rows_too_long"] == 0


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".csv", ".jsonl", ".txt"]))
def test_any_bytes_build_a_valid_trace_workload_or_one_clear_error(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("fuzz") / f"t{suffix}"
    path.write_bytes(data)
    try:
        wl = build_workload("trace", trace_path=path, max_model_len=1024)
    except LoadgenError as err:
        assert "\n" not in str(err) and len(str(err)) < 400
        return
    for r in wl.requests:
        assert r.prompt_len >= 1 and r.output_len >= 1 and r.prompt_len + r.output_len <= 1024
    assert all(0 <= t <= 30 * 86400 for t in wl.timestamps_s)
