"""The re-measured configs' table says what a re-measurement found, never a bare 0.00: the
vLLM default, measured only at the recommended rate and missing there, read "confirmed 0.00"
as though it served nothing."""

from tuner.report.render import top_table


def row(confirmed_rps, repeats):
    return {"trial": 0, "config": {"max_num_batched_tokens": 2048}, "value": 24.42,
            "confirmed_rps": confirmed_rps, "repeats": repeats, "terms": []}  # fmt: skip


def test_each_outcome_of_a_re_measurement_reads_as_what_happened():
    _, rows = top_table({"top": [row(30.43, 2), row(0.0, 3), row(None, 0)]})
    assert [r[3] for r in rows] == [
        "30.43",
        "cleared no re-measured rate (3 draws)",
        "not re-measured",
    ]
    assert all(r[2] == "24.42" for r in rows)  # the search's figure stays beside it
