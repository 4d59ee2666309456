"""The configs a study measures before its sampler: the references and a budget sweep."""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from tuner.search.rules import Scenario, rule_of_thumb_knobs
from tuner.search.space import IntRange, SearchSpace
from tuner.search.study import ROLE, Role, has_role


def reference_configs(space: SearchSpace, scenario: Scenario) -> list[tuple[Role, dict]]:
    """The default config and the rule of thumb (pins from --fix apply to both)."""
    base = space.normalise({**space.base, **space.fixed})
    refs = [(Role.DEFAULT, base)]
    thumb = space.normalise(rule_of_thumb_knobs(scenario, base))
    if thumb != base:
        refs.append((Role.RULE_OF_THUMB, thumb))
    return refs


def sweep_configs(space: SearchSpace, scenario: Scenario) -> list[dict[str, Any]]:
    """The default config at budgets 4x apart across the searched range.

    Capacity is roughly unimodal in the budget, so a coarse sweep along it is the most
    informative start the sampler can get; each point that loses is pruned after one level.
    """
    domain = space.domains.get("max_num_batched_tokens")
    if not isinstance(domain, IntRange):
        return []
    base = space.normalise({**space.base, **space.fixed})
    taken = {k["max_num_batched_tokens"] for _, k in reference_configs(space, scenario)}
    out, budget = [], domain.low
    while budget <= domain.high:
        knobs = space.normalise({**base, "max_num_batched_tokens": budget})
        if knobs["max_num_batched_tokens"] not in taken:
            out.append(knobs)
        budget *= 4
    return out


def enqueue_starting_configs(
    study: optuna.Study, space: SearchSpace, scenario: Scenario, sweep: bool = True
) -> list[str]:
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
            notes.append(f"the {role.value} config uses a value --param excludes; not measured")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a reference outside a narrowed range is intended
            study.enqueue_trial(space.to_params(knobs), user_attrs={ROLE: role.value})
    return notes
