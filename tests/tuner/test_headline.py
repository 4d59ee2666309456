"""The headline claims a ratio over the default only when the same traffic shows it."""

from tuner.report.summary import (
    DEFAULT_BEST,
    SAME_TRAFFIC,
    UNCHECKED,
    WITHIN_NOISE,
    headline,
    same_rate_sentence,
    summary_line,
)

TERM = {"metric": "tpot_p99", "value_ms": 25.0, "limit_ms": 30.0, "low_ms": 20.0,
        "high_ms": 28.0}  # fmt: skip


def rec(default_meets: bool | None, draws: int = 1, missed: int | None = None) -> dict:
    same = None
    if default_meets is not None:
        term = dict(TERM, value_ms=25.0 if default_meets else 41.0, low_ms=20.0 if
                    default_meets else 35.0)  # fmt: skip
        same = {"rate_rps": 6.0, "default": {"meets_slo": default_meets, "terms": [term],
                                             "kept_up": True, "served_fraction": 1.0,
                                             "error_rate": 0.0, "draws": draws,
                                             "draws_missed": missed}}  # fmt: skip
    out = {"slo": "tpot_p99=30ms", "feasible": True, "objective": {"mode": "capacity"},
           "best": {"config": {"max_num_batched_tokens": 1024}, "capacity_rps": 6.3},
           "default": {"config": {"max_num_batched_tokens": 2048}, "capacity_rps": 5.0},
           "ratio_vs_default": 1.26, "default_at_recommended_rate": same}  # fmt: skip
    out["headline"] = headline(out)
    return out


def test_a_ratio_the_same_traffic_confirms_is_claimed():
    r = rec(default_meets=False)
    assert r["headline"] == {"basis": SAME_TRAFFIC, "claimed_ratio": 1.26}
    text = summary_line(r)
    assert "1.26x the vLLM default's 5.00" in text and "the default misses the SLO" in text


def test_a_default_that_holds_at_the_same_rate_makes_the_difference_noise():
    r = rec(default_meets=True)
    assert r["headline"]["basis"] == WITHIN_NOISE and r["headline"]["claimed_ratio"] is None
    text = summary_line(r)
    assert text.startswith("keep the vLLM default") and "within noise" in text
    assert "recommended: budget" not in text


def test_a_ratio_never_checked_at_the_same_traffic_says_so():
    r = rec(default_meets=None)
    assert r["headline"]["basis"] == UNCHECKED
    assert summary_line(r).endswith("(not checked at the same traffic)")


def test_a_ratio_over_a_default_figure_that_did_not_hold_says_so():
    # A run whose time ran out before the same-traffic check: the default's search read 9.22
    # req/s, and re-measured there it missed (127 ms), so the ratio rests on a doubtful figure.
    r = rec(default_meets=None)
    r["default"].update(capacity_rps=9.22, held_when_remeasured=False)
    text = summary_line(r)
    assert "the vLLM default's 9.22, a figure that did not hold when re-measured" in text
    assert text.endswith("(not checked at the same traffic)")
    # Checked at the same traffic, it missed there: the gap is shown, but not its size. A run
    # read "7.52 req/s, 0.98x the vLLM default's 7.63" with the default missing at 7.52.
    r = rec(default_meets=False)
    r["default"]["held_when_remeasured"] = False
    r["headline"] = headline(r)
    assert r["headline"] == {"basis": SAME_TRAFFIC, "claimed_ratio": None}
    text = summary_line(r)
    assert "1.26x" not in text
    assert ("the vLLM default's search read 5.00 req/s, a figure that did not hold when "
            "re-measured; at that rate the default misses") in text  # fmt: skip


def test_a_default_sunk_pooled_by_one_bad_draw_does_not_make_a_claim():
    # Pooled over three draws its p99 missed, yet alone it met the SLO on two of them.
    r = rec(default_meets=False, draws=3, missed=1)
    assert r["headline"]["basis"] == WITHIN_NOISE and r["headline"]["claimed_ratio"] is None
    text = summary_line(r)
    assert text.startswith("keep the vLLM default") and "on 2 of its 3 arrival draws alone" in text
    sentence = same_rate_sentence(r["default_at_recommended_rate"])
    assert "meets the SLO on 2 of its 3 arrival draws alone" in sentence
    # Missed on two of three alone: that is a miss, and the ratio is claimed.
    r = rec(default_meets=False, draws=3, missed=2)
    assert r["headline"] == {"basis": SAME_TRAFFIC, "claimed_ratio": 1.26}


def test_a_default_whose_own_capacity_did_not_hold_gives_no_ratio():
    # Its search read 9.49 req/s, its re-measurement passed at no rate, and the
    # recommendation was confirmed lower: a ratio of 0.80 would compare against nothing real.
    r = rec(default_meets=False, draws=3, missed=1)
    r["default"].update(capacity_rps=9.49, held_when_remeasured=False)
    r["ratio_vs_default"] = 0.80
    text = summary_line(r)
    assert text.startswith("keep the vLLM default") and "0.80x" not in text
    assert "the default's own 9.49 req/s did not hold when re-measured" in text


def test_the_default_chosen_is_kept_without_a_ratio_over_itself():
    # A run whose searched configs all failed their confirmation chose the default; it read
    # "recommended: budget=2048 ... 0.76x the vLLM default's 8.23", the same config twice.
    r = rec(default_meets=None)
    r["best"] = r["default"] = {"config": {"max_num_batched_tokens": 2048}, "capacity_rps": 8.23}
    r["ratio_vs_default"] = 1.0
    r["headline"] = headline(r)
    assert r["headline"] == {"basis": DEFAULT_BEST, "claimed_ratio": None, "recommend": "default"}
    text = summary_line(r)
    assert text == ("keep the vLLM default (budget=2048): no config measured beat its 8.23 "
                    "req/s within tpot_p99=30ms")  # fmt: skip
