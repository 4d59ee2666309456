"""How a study starts: the references (the default config and the rule of thumb) and the budget
sweep it queues before its sampler, and the rate the first trial starts at.

The rule of thumb is the budget engineers pick from a table today (vLLM's tuning notes,
Sarathi-Serve's 512/2048, serving blogs), at the lower end of its range.
"""

from __future__ import annotations

import enum
import math
import warnings

import optuna

from loadgen import RequestRecord
from tuner.errors import TuneError
from tuner.measure.meter import Meter
from tuner.report.live import StatusSink
from tuner.report.summary import short_config
from tuner.search.space import BUDGET, IntRange, SearchSpace
from tuner.search.study import has_role
from tuner.store import attrs
from tuner.store.records import Role
from tuner.targets.knobs import Knobs

# The first trial starts at this share of the throughput measured on a burst of the request list
# (a burst's prefill-heavy throughput sits below the sustained capacity on the CPU preset).
START_FRACTION_OF_BURST = 0.8
MIN_START_RPS = 0.05


class Scenario(enum.StrEnum):
    CODE = "code"
    CHAT = "chat"
    RAG = "rag"
    BATCH = "batch"


RULE_OF_THUMB_BUDGET = {
    Scenario.CODE: 2048,
    Scenario.CHAT: 4096,
    Scenario.RAG: 8192,
    Scenario.BATCH: 16384,
}
RULE_OF_THUMB_TEXT = {
    Scenario.CODE: "2048 for code completion",
    Scenario.CHAT: "4096-8192 for chat",
    Scenario.RAG: "8192-16384 for long-context RAG",
    Scenario.BATCH: "16384+ for offline batch",
}

_WORKLOAD_SCENARIO = {
    "code": Scenario.CODE,
    "chat": Scenario.CHAT,
    "mixed": Scenario.CHAT,  # mostly chat traffic with a minority of long prompts
    "agent": Scenario.CHAT,
    "random": Scenario.CHAT,
    "trace": Scenario.CHAT,  # the Azure conversation trace
    "rag": Scenario.RAG,
    "summarize": Scenario.RAG,
}


def scenario_for(workload: str) -> Scenario:
    """The table row a serving engineer would read for this workload."""
    return _WORKLOAD_SCENARIO.get(workload, Scenario.CHAT)


def rule_of_thumb_knobs(scenario: Scenario, default: Knobs) -> Knobs:
    """The default config with the table's token budget (never below max_num_seqs)."""
    budget = max(RULE_OF_THUMB_BUDGET[scenario], default.get("max_num_seqs", 1))
    return {**default, "max_num_batched_tokens": budget}


def reference_configs(space: SearchSpace, scenario: Scenario) -> list[tuple[Role, Knobs]]:
    """The target's default config and the rule of thumb (pins from --fix apply to both)."""
    default = space.default_config()
    refs = [(Role.DEFAULT, default)]
    thumb = space.normalise(rule_of_thumb_knobs(scenario, default))
    if thumb != default:
        refs.append((Role.RULE_OF_THUMB, thumb))
    return refs


def sweep_configs(space: SearchSpace, scenario: Scenario) -> list[Knobs]:
    """The default config at budgets 4x apart across the searched range.

    Capacity is roughly unimodal in the budget, so a coarse sweep along it is the most
    informative start the sampler can get; each point that loses is pruned after one level.
    """
    domain = space.domains.get(BUDGET)
    if not isinstance(domain, IntRange):
        return []
    default = space.default_config()
    taken = {k[BUDGET] for _, k in reference_configs(space, scenario)}
    out, budget = [], domain.low
    while budget <= domain.high:
        knobs = space.normalise({**default, BUDGET: budget})
        if knobs[BUDGET] not in taken:
            out.append(knobs)
        budget *= 4
    return out


def enqueue_starting_configs(study: optuna.Study, space: SearchSpace, scenario: Scenario,
                             sweep: bool = True) -> list[str]:  # fmt: skip
    """Queue the references and (unless `sweep` is off) the budget sweep once per study; notes
    on what was skipped."""
    notes = []
    queued = reference_configs(space, scenario)
    if sweep and not has_role(study, Role.SWEEP):
        queued += [(Role.SWEEP, knobs) for knobs in sweep_configs(space, scenario)]
    for role, knobs in queued:
        if role.is_reference and has_role(study, role):
            continue
        if not space.expressible(knobs):
            notes.append(f"the {role.value} config is outside what can be searched; not measured")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a reference outside a narrowed range is intended
            study.enqueue_trial(space.to_params(knobs), user_attrs=attrs.role_attrs(role))
    return notes


def enqueue_default(study: optuna.Study, space: SearchSpace,
                    start_hint_rps: float | None = None) -> None:  # fmt: skip
    """Queue the default config alone (the simulator's path measures it first), its search
    starting at `start_hint_rps` when the simulator placed it."""
    role_attrs = attrs.role_attrs(Role.DEFAULT, start_hint_rps=start_hint_rps)
    study.enqueue_trial(space.to_params(space.default_config()), user_attrs=role_attrs)


async def first_start_rps(study: optuna.Study, meter: Meter, default: Knobs, burst: int,
                          display: StatusSink) -> float:  # fmt: skip
    """The first trial's start rate: the study's, or measured on a burst (and then kept)."""
    known = attrs.start_rate(study)
    if known:
        return known
    display.set_phase("calibrating: a burst of the request list on the default config")
    start = await calibrated_start_rps(study, meter, default, burst)
    display.line(f"first trial starts at {start:.2f} req/s (80% of a burst's throughput)")
    return start


async def calibrated_start_rps(
    study: optuna.Study, meter: Meter, default: Knobs, burst: int
) -> float:
    """The first trial's start rate: a share of the throughput on a burst of the first `burst`
    requests, on the default config. Kept in the study, so a resumed run and other workers
    reuse it instead of measuring again."""
    known = attrs.start_rate(study)
    if known:
        return known
    await meter.target.apply(default)
    burst_meter = Meter(meter.target, meter.requests[:burst], meter.slo, meter.settings,
                        meter.rules, meter.clock)  # fmt: skip
    run = await burst_meter.level(math.inf)
    _check_served(run.records, default)
    start = max(MIN_START_RPS, START_FRACTION_OF_BURST * run.level.request_throughput_rps)
    attrs.set_start_rate(study, start)
    return start


def _check_served(records: list[RequestRecord], default: Knobs) -> None:
    """A default that answers no request of the burst is a broken set-up (a wrong model path,
    a server that rejects the prompts), not a capacity of zero: searching from there would
    spend the whole budget at the floor rate and recommend whatever served a trickle."""
    measured = [r for r in records if not r.warmup]
    if not measured or any(r.success for r in measured):
        return
    first = next((r.error for r in measured if r.error), "no error given")
    raise TuneError(f"the target's default config ({short_config(default)}) answered none of the "
                    f"{len(measured)} requests of the calibration burst; the first failed with "
                    f"{first!r}: make the server serve this workload, then tune")  # fmt: skip
