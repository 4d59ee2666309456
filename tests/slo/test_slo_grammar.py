"""The SLO grammar: valid strings parse exactly; every malformed term is named in the error."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo import SLO, Metric, SLOError, SLOTerm, Stat, parse_slo


def test_parses_the_design_example():
    slo = parse_slo("tpot_p99=30ms,ttft_p99=2s")
    assert slo == SLO(
        terms=[SLOTerm(Metric.TPOT, Stat.P99, 0.030), SLOTerm(Metric.TTFT, Stat.P99, 2.0)]
    )


def test_default_unit_is_ms_and_spaces_and_case_are_tolerated():
    slo = parse_slo(" ITL_p99.9 = 25 , e2el_mean=1.5s ")
    assert slo.terms[0] == SLOTerm(Metric.ITL, Stat.P999, 0.025)
    assert slo.terms[1] == SLOTerm(Metric.E2EL, Stat.MEAN, 1.5)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "empty"),
        ("tpot_p99=30ms,", "empty term"),
        ("tpot_p99", "'tpot_p99'"),
        ("tpot_p99==30", "exactly one '='"),
        ("latency_p99=30ms", "'latency'"),
        ("tpot_p98=30ms", "'p98'"),
        ("tpot=30ms", "metric_stat"),
        ("tpot_p99=30us", "'us'"),
        ("tpot_p99=fast", "'fast'"),
        ("tpot_p99=0ms", "positive"),
        ("tpot_p99=-3ms", "'-3ms'"),
        ("tpot_p99=30ms,tpot_p99=40ms", "repeats tpot_p99"),
    ],
)
def test_malformed_terms_raise_one_clear_error(text, named):
    with pytest.raises(SLOError) as err:
        parse_slo(text)
    msg = str(err.value)
    assert named in msg
    assert "\n" not in msg
    assert isinstance(err.value, ValueError)


def test_error_lists_the_valid_choices():
    with pytest.raises(SLOError, match="ttft, tpot, itl, e2el"):
        parse_slo("tbt_p99=30ms")
    with pytest.raises(SLOError, match=r"p50, p90, p95, p99, p99\.9, mean"):
        parse_slo("tpot_max=30ms")


_term = st.tuples(
    st.sampled_from(list(Metric)),
    st.sampled_from(list(Stat)),
    st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from(["ms", "s", ""]),
    st.sampled_from(["", " "]),
)


@given(st.lists(_term, min_size=1, max_size=6, unique_by=lambda t: (t[0], t[1])))
def test_generated_valid_slos_parse_to_their_limits(terms):
    text = ",".join(f"{sp}{m.value}_{s.value}={sp}{v!r}{u}{sp}" for m, s, v, u, sp in terms)
    slo = parse_slo(text)
    assert [(t.metric, t.stat) for t in slo.terms] == [(m, s) for m, s, *_ in terms]
    for got, (_, _, v, u, _) in zip(slo.terms, terms, strict=True):
        assert math.isclose(got.limit_s, v * (1.0 if u == "s" else 1e-3), rel_tol=1e-12)
    again = parse_slo(str(slo))  # the canonical form parses back to the same limits
    for a, b in zip(again.terms, slo.terms, strict=True):
        assert (a.metric, a.stat) == (b.metric, b.stat)
        assert math.isclose(a.limit_s, b.limit_s, rel_tol=1e-12)


@given(st.text(max_size=40))
def test_any_string_parses_or_raises_slo_error(text):
    try:
        slo = parse_slo(text)
    except SLOError as err:
        assert "\n" not in str(err)
    else:
        assert slo.terms and all(t.limit_s > 0 for t in slo.terms)


@given(st.text(alphabet="tpoitfe2l_9.=,msp0315 ", max_size=30))
def test_near_miss_strings_parse_or_raise_slo_error(text):
    try:
        slo = parse_slo(text)
    except SLOError as err:
        assert "\n" not in str(err) and "SLO" in str(err)
    else:
        assert str(slo)  # a parsed SLO always has a printable canonical form


@pytest.mark.parametrize(
    "text",
    [
        "x" * 10_000,
        "tpot_p99=" + "9" * 100_000 + "!",  # quadratic for a backtracking regex
        "a" * 10_000 + "_p99=3",
        "tpot_" + "p" * 10_000 + "=3",
        "tpot_p99=3" + "q" * 10_000,
        "tpot_p99=3," + "ttft_p99=" + "1" * 10_000 + "us",
    ],
)
def test_a_huge_bad_slo_is_quoted_short(text):
    with pytest.raises(SLOError) as err:
        parse_slo(text)
    msg = str(err.value)
    assert len(msg) < 300 and "...'" in msg and "\n" not in msg
