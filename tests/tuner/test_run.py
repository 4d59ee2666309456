"""A whole `run_tune` against a simulated target on a simulated clock: every phase, no sleeping."""

import json
import math

import pandas as pd
import pytest

import tuner.report.plots  # noqa: F401  loaded once here, not inside the timed tests
from tuner.report.publish import report_main
from tuner.run import run_tune
from tuner.settings import TuneSettings

BUDGET_S = 600.0


def settings(tmp_path, **changes) -> TuneSettings:
    # Short levels, few trials, one config confirmed, a journal file (the quickest storage):
    # every phase runs, on little data.
    base = {"slo": "tpot_p99=30ms", "num_requests": 40, "level_s": 1.0, "trials": 8,
            "time_budget_s": BUDGET_S, "top_k": 1, "run_dir": str(tmp_path / "run"),
            "storage": str(tmp_path / "study.journal")}  # fmt: skip
    return TuneSettings(**{**base, **changes})


async def test_a_whole_run_finds_the_budget_that_serves_the_most(tmp_path, sim_target, fake_clock):
    start_s = fake_clock()
    rec = await run_tune(settings(tmp_path), quiet=True, clock=fake_clock, target=sim_target)

    # The config every comparison is against is the target's own default, and the report
    # says where it comes from.
    default, best = rec["default"], rec["best"]
    assert default["config"] == sim_target.knobs.defaults
    assert rec["target"]["default_source"] == "the simulated CPU row"
    # The simulated optimum is a 512-token budget (12 req/s against the default's 6).
    assert best["config"]["max_num_batched_tokens"] <= 1024 and best["confirmed"]
    assert rec["ratio_vs_default"] > 1.3
    # Knobs the target lacks are neither searched nor recommended.
    assert set(best["config"]) == set(sim_target.knobs.defaults)
    assert "partial" not in rec["flags"]["vllm"] and "policy" not in rec["search"]["space"]
    # At the recommended rate the default misses: the same verdict the search gave it there.
    same = rec["default_at_recommended_rate"]
    assert same["rate_rps"] == best["rate_rps"] and not same["default"]["meets_slo"]
    assert "at that rate the default misses the SLO (tpot_p99" in rec["summary"]
    # Those draws are measurements of the default too: it claims no capacity above that rate.
    assert default["capacity_rps"] < best["capacity_rps"]
    # A config that fails at the best capacity so far is pruned after that one level.
    pruned = [t for t in rec["trials"] if t["state"] == "pruned"]
    assert pruned and all(t["levels"] == 1 for t in pruned)
    # All time was simulated time, and the run kept within its budget on that clock.
    assert 0 < rec["search"]["elapsed_s"] == fake_clock() - start_s <= BUDGET_S
    # The phases account for every second of it, the report's setup table says so.
    phases = rec["phases_s"]
    assert sum(phases.values()) == pytest.approx(rec["elapsed_s"]) and phases["starting"] >= 0
    assert phases["confirming the top configs"] > 0 and phases["searching (tpe, capacity)"] > 0
    report = (tmp_path / "run" / "recommendation.md").read_text()
    assert f"{rec['elapsed_s']:.0f} s to the recommendation (" in report
    assert sim_target.closed


async def test_a_short_budget_stops_the_search_and_still_reports(tmp_path, sim_target, fake_clock):
    rec = await run_tune(settings(tmp_path, time_budget_s=150.0), quiet=True, clock=fake_clock,
                         target=sim_target)  # fmt: skip
    assert rec["search"]["stopped_by"] == "time budget"
    assert rec["search"]["elapsed_s"] <= 150.0
    # The references always run: the report needs their capacity.
    assert {t["role"] for t in rec["trials"]} >= {"default", "rule_of_thumb"}
    assert (tmp_path / "run" / "recommendation.html").exists()


async def test_tune_report_rebuilds_the_same_recommendation(
    tmp_path, sim_target, fake_clock, capsys
):
    rec = await run_tune(settings(tmp_path, trials=6), quiet=True, clock=fake_clock,
                         target=sim_target)  # fmt: skip
    assert report_main([str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rec


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (
            {"params": ["long_prefill_token_threshold_adaptive=true,false"]},
            "--param long_prefill_token_threshold_adaptive: ",
        ),
        ({"fixed": ["policy=prefill_first"]}, "--fix policy: "),
    ],
)
async def test_a_knob_the_target_lacks_is_refused(tmp_path, sim_target, fake_clock, changes, named):
    from tuner.errors import TuneError

    with pytest.raises(TuneError, match=named):
        await run_tune(settings(tmp_path, **changes), quiet=True, clock=fake_clock,
                       target=sim_target)  # fmt: skip


async def test_a_budget_too_short_for_the_default_reports_its_capacity_as_a_lower_bound(
    tmp_path, sim_target, fake_clock
):
    rec = await run_tune(settings(tmp_path, time_budget_s=20.0, start_rps=2.0), quiet=True,
                         clock=fake_clock, target=sim_target)  # fmt: skip
    default = rec["default"]
    assert default["capacity_rps"] == 2.0 and default["lower_bound"]  # one level, then the end
    assert default["limited_by"].startswith("not measured: its search was cut short")
    # Nothing else fitted in the budget: the default is kept, its figure named a lower bound.
    assert rec["summary"].startswith("keep the vLLM default")
    assert "2.00 req/s within tpot_p99=30ms (a lower bound" in rec["summary"]


async def test_a_target_too_slow_for_the_budget_is_told_what_budget_its_levels_need(
    tmp_path, sim_target, fake_clock, capsys
):
    # The default fails its first level (40 req/s against 6); the next, lower rate's 400
    # requests cannot end within the 20 s budget, so no level passes and the run says why.
    rec = await run_tune(settings(tmp_path, time_budget_s=20.0, start_rps=40.0, num_requests=400,
                                  min_requests=400), quiet=True, clock=fake_clock,
                         target=sim_target)  # fmt: skip
    assert not rec["feasible"]
    cut = rec["time_cut"]
    assert cut["requests"] == 400 and cut["rate_rps"] < 40.0
    assert cut["trial"] == rec["closest"]["trial"]  # the next level of the nearest search
    assert cut["level_s"] >= 400 / cut["rate_rps"] and cut["budget_needed_s"] > 20.0
    minutes = math.ceil(cut["budget_needed_s"] / 60)
    assert f"no level passed before the time budget ran out: the next, at {cut['rate_rps']:.2f}" \
        in rec["summary"]  # fmt: skip
    assert f"give --time-budget {minutes}m or more (--resume goes on from there), or a smaller " \
        "--min-requests" in rec["summary"]  # fmt: skip
    # The level left out is kept with the trial: the report, rebuilt, says the same.
    assert report_main([str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"] == rec["summary"]


async def test_a_run_resumed_with_the_budget_it_was_told_goes_on_from_where_it_was_cut(
    tmp_path, sim_targets, fake_clock
):
    # As above, a level the default (6 req/s) fails, then no time for the next. Resumed on the
    # same folder with the budget the summary asked for, the default goes on from that next
    # level, and measures no rate a second time.
    slow = {"start_rps": 8.0, "num_requests": 400, "min_requests": 400, "storage": None}
    first = await run_tune(settings(tmp_path, time_budget_s=20.0, **slow), quiet=True,
                           clock=fake_clock, target=sim_targets())  # fmt: skip
    cut, left = first["trials"][0], first["time_cut"]
    assert cut["role"] == "default" and cut["levels"] == 1 and left["trial"] == cut["trial"]
    asked = math.ceil(left["budget_needed_s"] / 60) * 60
    rec = await run_tune(settings(tmp_path, time_budget_s=asked, **slow), quiet=True,
                         clock=fake_clock, target=sim_targets())  # fmt: skip

    default = rec["default"]
    again = next(t for t in rec["trials"] if t["trial"] == default["trial"])
    assert again["continues"] == cut["trial"] and again["carried_levels"] == 1
    table = pd.read_csv(tmp_path / "run" / "trials.csv")
    rates = table[table["trial"] == default["trial"]]["rate_rps"].tolist()
    assert rates[0] == left["rate_rps"] and 8.0 not in rates
    # Its capacity keeps the carried failure: nothing at or above 8 req/s is claimed.
    assert 0 < default["capacity_rps"] < 8.0 and rec["time_cut"] is None
    md = (tmp_path / "run" / "recommendation.md").read_text()
    assert f"(+1 of trial {cut['trial'] + 1})" in md


async def run_twice_on_20_s(tmp_path, sim_targets, fake_clock, start_rps: float):
    """A run of 400-request levels on a 20 s budget, then its resume on as short a one: both
    results, and when the resume started."""
    slow = {"start_rps": start_rps, "num_requests": 400, "min_requests": 400, "storage": None,
            "time_budget_s": 20.0}  # fmt: skip
    first = await run_tune(settings(tmp_path, **slow), quiet=True, clock=fake_clock,
                           target=sim_targets())  # fmt: skip
    start_s = fake_clock()
    again = await run_tune(settings(tmp_path, **slow), quiet=True, clock=fake_clock,
                           target=sim_targets())  # fmt: skip
    return first, again, start_s


async def test_a_default_that_went_on_without_a_level_of_its_own_reports_what_it_carried(
    tmp_path, sim_targets, fake_clock
):
    # The default (6 req/s) passes 4 req/s, with no time for 8. Resumed on as short a budget,
    # it goes on from there and again has no time for 8: no level of its own, yet the report
    # gives its capacity with the terms measured at that rate.
    first, rec, _ = await run_twice_on_20_s(tmp_path, sim_targets, fake_clock, start_rps=4.0)
    default = rec["default"]
    again = next(t for t in rec["trials"] if t["trial"] == default["trial"])
    assert again["continues"] == first["default"]["trial"] and again["levels"] == 0
    assert default["capacity_rps"] == first["default"]["capacity_rps"] == 4.0
    assert default["rate_rps"] == 4.0 and default["lower_bound"]
    assert default["terms"] == first["default"]["terms"]


async def test_a_default_that_serves_nothing_stops_the_run_with_the_servers_error(
    tmp_path, refusing_default_target, fake_clock
):
    from tuner.errors import TuneError

    with pytest.raises(TuneError, match=r"answered none of the \d+ requests.*HTTP 503: overloaded"):
        await run_tune(settings(tmp_path), quiet=True, clock=fake_clock,
                       target=refusing_default_target())  # fmt: skip


async def test_a_default_with_no_successful_request_still_gets_a_report(
    tmp_path, refusing_default_target, fake_clock
):
    # It served the calibration burst, then failed every request of its own trial.
    rec = await run_tune(settings(tmp_path), quiet=True, clock=fake_clock,
                         target=refusing_default_target(from_level=2))  # fmt: skip
    default = rec["default"]
    assert default["capacity_rps"] == 0.0
    assert all(t["value_ms"] is None for t in default["terms"])
    md = (tmp_path / "run" / "recommendation.md").read_text()
    assert "tpot_p99 without a successful request / 30 ms" in md
    assert (tmp_path / "run" / "recommendation.html").exists()


async def test_a_worker_reports_a_default_another_worker_measured(
    tmp_path, sim_targets, fake_clock
):
    # Worker "a" measures the references and stops; worker "b" joins the same study, searches
    # and confirms. The default's level records are on a's disk only: b must report the
    # capacity the study holds for it, not a capacity of nothing judged on no records.
    def worker(name: str, **changes):
        return run_tune(settings(tmp_path, run_dir=str(tmp_path / name), **changes), quiet=True,
                        clock=fake_clock, target=sim_targets())  # fmt: skip

    first = await worker("a", trials=2)
    rec = await worker("b")
    default = rec["default"]
    assert default["trial"] == first["default"]["trial"]
    assert default["capacity_rps"] > 0 and all(t["value_ms"] is not None for t in default["terms"])
    assert (tmp_path / "b" / "recommendation.md").exists()


async def test_every_search_level_holds_at_least_min_requests(tmp_path, sim_target, fake_clock):
    # One second of arrivals at these rates is a handful of requests; the floor makes it 30.
    run = tmp_path / "run"
    await run_tune(settings(tmp_path, min_requests=30, trials=3), quiet=True, clock=fake_clock,
                   target=sim_target)  # fmt: skip
    levels = sorted((run / "records").glob("trial-*-level-*.jsonl"))
    assert levels and all(len(p.read_text().splitlines()) >= 30 for p in levels)
    info = json.loads((run / "run.json").read_text())
    assert info["workload"]["min_requests_per_level"] == 30


async def test_a_default_no_config_beats_is_kept_with_one_figure(tmp_path, sim_target, fake_clock):
    # Only budgets above the default's searched: each serves less than its 6 req/s.
    params = ["max_num_batched_tokens=4096..32768"]
    rec = await run_tune(settings(tmp_path, params=params), quiet=True, clock=fake_clock,
                         target=sim_target)  # fmt: skip
    assert rec["best"]["config"] == rec["default"]["config"]
    # One config, one figure: never a ratio of the default over itself other than 1.
    assert rec["best"] == rec["default"] and rec["ratio_vs_default"] == 1.0
    assert rec["headline"]["basis"] == "default_best"
    assert rec["summary"].startswith("keep the vLLM default (budget=2048 ")
    assert "no config measured beat its" in rec["summary"] and "x the vLLM" not in rec["summary"]
    assert "--max-num-batched-tokens 2048" in rec["flags"]["vllm"]
