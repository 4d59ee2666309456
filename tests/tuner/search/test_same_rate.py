"""The default measured at the recommendation's rate, on the real engine, and how it is reported."""

import pytest

from engine_lite import EngineConfig
from loadgen import build_workload
from slo import parse_slo
from tuner.measure.draws import LevelMix
from tuner.measure.judge import judge_runs
from tuner.measure.meter import LevelSettings, Meter
from tuner.report.render import render_markdown
from tuner.report.summary import same_rate_sentence
from tuner.search.confirm import default_at_rate
from tuner.store.codec import same_rate_json
from tuner.store.records import Candidate, Mode, Role, rules_for
from tuner.store.runfiles import SAME_RATE_RECORDS, RunFiles
from tuner.targets.builtin import BuiltinTarget

RATE = 8.0


async def _same_rate(tmp_path, slo_text: str) -> dict:
    slo = parse_slo(slo_text)
    target = BuiltinTarget(EngineConfig(kv_cache_memory_gb=0.25))
    requests = build_workload("random", num_requests=8, input_len=64, output_len=8).requests
    files = RunFiles(tmp_path)
    files.ensure()
    meter = Meter(target, requests, slo, rules=rules_for(Mode.CAPACITY, False))
    chosen_knobs = {**target.knobs.defaults, "max_num_batched_tokens": 512}
    try:
        await target.apply(chosen_knobs)
        run = await meter.level(RATE)
        verdict = judge_runs([run.run()], slo, meter.rules, RATE, seed=0)
        chosen = Candidate(trial=3, role=Role.SEARCH, knobs=chosen_knobs, search_value=RATE,
                           verdict=verdict, repeats=1,
                           confirmed_rps=RATE if verdict.clears else 0.0)  # fmt: skip
        same = await default_at_rate(meter, files, target.knobs.defaults, chosen)
    finally:
        await target.close()
    return same_rate_json(same)


async def test_a_default_that_misses_is_named_with_its_figure(tmp_path):
    # No engine holds TPOT p99 under a microsecond: the default must miss, and say by how much.
    same = await _same_rate(tmp_path, "tpot_p99=0.001ms,ttft_p99=60s")
    assert same["rate_rps"] == RATE
    d = same["default"]
    assert d["meets_slo"] is False and d["kept_up"] is True
    tpot = next(t for t in d["terms"] if t["metric"] == "tpot_p99")
    assert tpot["value_ms"] > tpot["limit_ms"] and not tpot["clears"]
    sentence = same_rate_sentence(same)
    assert sentence.startswith(f"At the recommended {RATE:.2f} req/s the vLLM default misses")
    assert f"tpot_p99 {tpot['value_ms']:.1f} ms (limit 0.001 ms; its whole 95% interval" in sentence
    assert "ttft_p99" not in sentence  # only the terms it missed
    # Its miss was certain after two requests: the draw stopped there rather than drain the
    # rest, and the sentence says its figures are over what finished.
    assert d["draws_stopped"] == 1 and d["draws_missed"] == 1
    assert "(measured once; stopped once the SLO was already broken)" in sentence
    # The default's requests are kept, as every measured level's are, those the stop left
    # unmeasured among them.
    lines = (tmp_path / SAME_RATE_RECORDS).read_text().splitlines()
    assert len(lines) == 8 and any("the replay stopped early" in line for line in lines)


async def test_a_default_that_meets_says_so_and_the_report_shows_both(tmp_path):
    same = await _same_rate(tmp_path, "tpot_p99=60s")
    assert same["default"]["meets_slo"] and same["recommended"]["meets_slo"]
    assert same["default"]["draws_stopped"] == 0  # a draw that holds runs to its end
    assert (
        same_rate_sentence(same)
        == f"At {RATE:.2f} req/s the vLLM default also meets the SLO (measured once)."
    )
    rec = {"slo": "tpot_p99=60s", "summary": "s", "feasible": True, "best": None, "default": None,
           "objective": {"mode": "capacity", "definition": "d"}, "trials": [],
           "default_at_recommended_rate": same}  # fmt: skip
    md = render_markdown(rec, {})
    assert "## Same traffic" in md
    rows = [
        line for line in md.splitlines() if line.startswith(("| recommended", "| vLLM default"))
    ]
    assert len(rows) == 2 and all(r.rstrip(" |").endswith("yes") for r in rows)


@pytest.mark.parametrize("same", [None, {}])
def test_no_measurement_no_sentence(same):
    assert same_rate_sentence(same) is None


def test_a_miss_the_interval_does_not_settle_is_stated_as_a_point_estimate():
    term = {"term": "tpot_p99=30ms", "metric": "tpot_p99", "limit_ms": 30.0, "value_ms": 51.9,
            "low_ms": 20.3, "high_ms": 164.1, "margin": -0.73, "clears": False}  # fmt: skip
    same = {"rate_rps": 11.58,
            "default": {"meets_slo": False, "kept_up": True, "served_fraction": 1.0,
                        "error_rate": 0.0, "terms": [term]},
            "recommended": {"meets_slo": True, "terms": [term]}}  # fmt: skip
    sentence = same_rate_sentence(same)
    assert "tpot_p99 51.9 ms (limit 30 ms; 95% interval 20.3-164.1 ms:" in sentence
    assert "does not settle it" in sentence


async def test_the_default_is_judged_on_as_many_arrival_draws_as_the_recommendation(tmp_path):
    """A p99 over one level belongs to its draw: the default gets the search's draw and a
    fresh one (the recommendation's pooled runs are its search level and one repeat), pooled."""
    requests = build_workload("random", num_requests=16, input_len=64, output_len=8).requests
    same = await _on_two_draws(tmp_path, requests, parse_slo("tpot_p99=60s"))
    assert same["default"]["draws"] == 2
    indices = [int(line.split('"index": ')[1].split(",")[0])
               for line in (tmp_path / SAME_RATE_RECORDS).read_text().splitlines()]  # fmt: skip
    assert sorted(indices) == list(range(16))  # two draws of other requests, not one twice
    assert "2 arrival draws pooled" in same_rate_sentence(same)


async def test_draws_that_split_evenly_get_one_more_to_decide(tmp_path):
    """The default held on one draw and missed on the other: a third decides (the headline
    counts a miss only when most draws miss alone)."""
    import dataclasses

    short = build_workload("random", num_requests=8, input_len=32, output_len=4).requests
    long = build_workload("random", num_requests=8, input_len=8000, output_len=4,
                          seed=1).requests  # fmt: skip
    # Contiguous stretches: the first is short prompts (it holds), the second long ones (it
    # misses); the third wraps round to the short ones again. Margins wide enough for a busy
    # machine: short prompts answer in ~5 ms, eight 8k prefills queue to a TTFT p99 of ~4 s;
    # a 150 ms limit on 3k prompts once failed the short draw in CI (one hiccup is a p99 of 8
    # requests).
    requests = [dataclasses.replace(r, index=i) for i, r in enumerate([*short, *long])]
    same = await _on_two_draws(tmp_path, requests, parse_slo("ttft_p99=1s"), LevelMix.CONTIGUOUS)
    assert same["default"]["draws"] == 3 and same["default"]["draws_missed"] == 1


async def _on_two_draws(tmp_path, requests, slo, mix=LevelMix.STRATIFIED) -> dict:
    """The default at RATE on two draws of 8 requests (a recommendation of one repeat)."""
    target = BuiltinTarget(EngineConfig(kv_cache_memory_gb=0.25))
    files = RunFiles(tmp_path)
    files.ensure()
    meter = Meter(target, requests, slo, LevelSettings(duration_s=1.0, min_requests=8, mix=mix),
                  rules_for(Mode.CAPACITY, False))  # fmt: skip
    try:
        run = await meter.level(RATE)
        verdict = judge_runs([run.run()], slo, meter.rules, RATE, seed=0)
        chosen = Candidate(3, Role.SEARCH, dict(target.knobs.defaults), RATE, verdict, 1, RATE)
        check = await default_at_rate(meter, files, target.knobs.defaults, chosen, draws=2)
    finally:
        await target.close()
    return same_rate_json(check)
