"""Confirmation on the real engine: a capacity that does not hold again steps down until it does."""

from optuna.trial import TrialState

from engine_lite import EngineConfig
from loadgen import build_workload
from slo import parse_slo
from tuner.measure.meter import Meter
from tuner.search.confirm import Confirmer, choose
from tuner.store.records import Mode, Role, TrialRecord, rules_for
from tuner.store.runfiles import RunFiles
from tuner.targets.builtin import BuiltinTarget


async def test_an_overstated_capacity_steps_down_to_a_rate_that_holds(tmp_path):
    target = BuiltinTarget(EngineConfig(kv_cache_memory_gb=0.25))
    # As if a lucky search had claimed 100 req/s for the default config.
    trial = TrialRecord(0, TrialState.COMPLETE, Role.DEFAULT, target.knobs.defaults, value=100.0,
                        capacity_rps=100.0)  # fmt: skip
    requests = build_workload("random", num_requests=8, input_len=2048, output_len=8).requests
    rules = rules_for(Mode.CAPACITY, target.facts.require_schedule)
    meter = Meter(target, requests, parse_slo("tpot_p99=500ms"), rules=rules)
    confirmer = Confirmer(meter, RunFiles(tmp_path), Mode.CAPACITY, step_factor=5.0)
    try:
        cand = await confirmer.confirm(trial, repeats=1)
    finally:
        await target.close()
    # Eight 2k-token prompts in 0.08 s queue up for most of a second of prefill: 100 req/s
    # does not hold again; a fifth (or a 25th) of it does, and that is what gets confirmed.
    rates = [run.rate_rps for run in RunFiles(tmp_path).confirm_runs(0)]
    assert rates[0] == 100.0 and len(rates) == cand.repeats >= 2
    assert cand.clears and cand.confirmed_rps in (20.0, 4.0)
    verdict = cand.verdict
    assert verdict.rate_rps == cand.confirmed_rps and verdict.clears
    assert verdict.served_fraction >= 0.85 and all(t.clears for t in verdict.terms)
    assert choose([cand]) is cand


def test_confirmation_starts_the_fewest_servers_the_running_config_first_the_default_last():
    from tuner.search.confirm import restart_order

    def trial(n: int, role: Role, budget: int) -> TrialRecord:
        return TrialRecord(n, TrialState.COMPLETE, role, {"max_num_batched_tokens": budget})

    default, a, b = (
        trial(0, Role.DEFAULT, 2048),
        trial(1, Role.SCREENED, 256),
        trial(2, Role.SEARCH, 512),
    )
    order = restart_order([default, a, b], running={"max_num_batched_tokens": 512})
    assert [t.number for t in order] == [2, 1, 0]
    # No server up (the built-in engine): the search's order, the default still last.
    assert [t.number for t in restart_order([default, a, b], None)] == [1, 2, 0]
