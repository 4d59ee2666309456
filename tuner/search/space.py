"""The knobs a study searches (only those the target can set), their ranges, and `--param` /
`--fix` parsing; every config is tied together by vLLM's `SchedulerConfig` rules."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from engine_lite import Policy
from tuner.errors import TuneError
from tuner.targets.knobs import KNOBS, KnobKind, Knobs, KnobSpace, knob

# Optuna parameter names of the default threshold dimension: a switch, and the cap as a fraction
# of the budget (a cap above the budget never binds, so a fraction keeps every sample meaningful).
THRESHOLD_SWITCH = "long_prefill"
THRESHOLD_FRACTION = "long_prefill_fraction"
BUDGET = "max_num_batched_tokens"
THRESHOLD = "long_prefill_token_threshold"


@dataclass(frozen=True)
class IntRange:
    """Integers from `low` to `high`, sampled uniformly in log space when `log`."""

    low: int
    high: int
    log: bool = False


@dataclass(frozen=True)
class Choices:
    """An explicit list of values."""

    values: tuple[Any, ...]


@dataclass(frozen=True)
class BudgetFraction:
    """Threshold off, or on at a fraction of the budget (a conditional dimension)."""

    low: float = 1 / 32
    high: float = 1.0


Domain = IntRange | Choices | BudgetFraction
Suggester = optuna.Trial | optuna.trial.FixedTrial  # what a space asks values from


@dataclass(frozen=True)
class SearchSpace:
    """Searched knobs with their domains, pinned knobs, and the facts that bound them."""

    domains: dict[str, Domain]
    fixed: Knobs
    block_size: int
    max_model_len: int
    base: Knobs  # the target's defaults

    def default_config(self) -> Knobs:
        """The target's default config, with the `--fix` pins."""
        return self.normalise({**self.base, **self.fixed})

    def suggest(self, trial: Suggester) -> Knobs:
        """One trial's config: the base with every searched knob suggested."""
        knobs = {**self.base, **self.fixed}
        for name in KNOBS:  # catalogue order: a knob before the knobs it bounds
            domain = self.domains.get(name)
            if domain is not None and self._applies(name, knobs):
                knobs[name] = self._suggest_one(trial, name, domain, knobs)
        return self.normalise(knobs)

    def to_params(self, knobs: Knobs) -> dict[str, Any]:
        """Optuna params that make `suggest` reproduce `knobs` (for enqueueing a known config)."""
        params: dict[str, Any] = {}
        for name in KNOBS:
            domain = self.domains.get(name)
            if domain is None or not self._applies(name, knobs):
                continue
            value = knobs[name]
            if _is_switched(name, domain):
                params[THRESHOLD_SWITCH] = "on" if value else "off"
                if value and isinstance(domain, BudgetFraction):
                    params[THRESHOLD_FRACTION] = value / knobs[BUDGET]
                elif value:
                    params[name] = value
            else:
                params[name] = KNOBS[name].to_json(value)
        return params

    def as_queued(self, knobs: Knobs) -> Knobs:
        """The config a trial enqueued with `knobs` runs: `suggest` replayed on their params
        (a threshold comes back as a block multiple of the budget's fraction)."""
        return self.suggest(optuna.trial.FixedTrial(self.to_params(knobs)))

    def expressible(self, knobs: Knobs) -> bool:
        """Can a trial of this space run `knobs`? Knobs the space does not search must keep the
        base value; out-of-range integers can be enqueued (Optuna takes them as they are), a
        value missing from a list of choices cannot."""
        default = self.default_config()
        if any(knobs.get(k) != v for k, v in default.items() if k not in self.domains):
            return False
        choices = [(n, d) for n, d in self.domains.items() if isinstance(d, Choices)]
        return all(knobs[name] in domain.values for name, domain in choices)

    def normalise(self, knobs: Knobs) -> Knobs:
        """Apply the rules that tie knobs together, as vLLM's SchedulerConfig checks them (a
        rule applies only to knobs the target has)."""
        out = dict(knobs)
        chunked = out.get("enable_chunked_prefill", True)
        if "policy" in out:
            out["policy"] = Policy(out["policy"])
        budget = _round_to_block(out[BUDGET], self.block_size)
        budget = max(budget, out.get("max_num_seqs", 1))
        if not chunked:
            budget = max(budget, self.max_model_len)  # without chunking a prompt fits one step
        out[BUDGET] = budget
        if THRESHOLD in out:
            out[THRESHOLD] = min(out[THRESHOLD], budget, self.max_model_len)
        if not out.get(THRESHOLD) and "long_prefill_token_threshold_adaptive" in out:
            out["long_prefill_token_threshold_adaptive"] = False  # only floors a threshold
        return out

    def describe(self) -> dict[str, str]:
        """One human-readable line per searched knob, for reports."""
        return {name: _describe(domain) for name, domain in self.domains.items()}

    def _applies(self, name: str, knobs: Knobs) -> bool:
        # vLLM 0.32: the adaptive switch only floors a threshold that is on.
        if name == "long_prefill_token_threshold_adaptive":
            return bool(knobs.get(THRESHOLD))
        return True

    def _suggest_one(self, trial: Suggester, name: str, domain: Domain, knobs: Knobs) -> Any:
        if isinstance(domain, Choices):
            return trial.suggest_categorical(name, [KNOBS[name].to_json(v) for v in domain.values])
        switched = _is_switched(name, domain)
        if switched and trial.suggest_categorical(THRESHOLD_SWITCH, ["off", "on"]) == "off":
            return 0
        if isinstance(domain, IntRange):
            low = max(domain.low, 1) if switched else domain.low
            return trial.suggest_int(name, low, domain.high, log=domain.log)
        frac = trial.suggest_float(THRESHOLD_FRACTION, domain.low, domain.high, log=True)
        budget = _round_to_block(knobs[BUDGET], self.block_size)
        return max(self.block_size, _round_to_block(frac * budget, self.block_size))


def _is_switched(name: str, domain: Domain) -> bool:
    """The threshold's "off" (0) is a switch of its own, not the bottom of a log range."""
    if isinstance(domain, BudgetFraction):
        return True
    return name == THRESHOLD and isinstance(domain, IntRange) and domain.low == 0


@dataclass(frozen=True, slots=True)
class SpaceFacts:
    """What bounds the default domains: the target and the workload."""

    block_size: int
    max_model_len: int
    longest_prompt: int


def _budget_domain(
    facts: SpaceFacts, base: Knobs, params: dict[str, Domain], fixed: Knobs
) -> IntRange:
    seqs = _largest(params.get("max_num_seqs"), fixed.get("max_num_seqs", base["max_num_seqs"]))
    low = -(-max(256, seqs) // facts.block_size) * facts.block_size  # rounded up to a block
    # "A few times the longest prompt", and never below the default so the default is inside.
    high = max(base[BUDGET], _pow2_ceil(4 * facts.longest_prompt), low)
    return IntRange(low, high, log=True)


# The knobs searched unless --param / --fix say otherwise, and their domains. Capacity is
# roughly unimodal in the budget; the threshold only matters below the longest prompts.
DEFAULT_DOMAINS: dict[str, Callable[..., Domain]] = {
    BUDGET: _budget_domain,
    THRESHOLD: lambda *_: BudgetFraction(),
    "long_prefill_token_threshold_adaptive": lambda *_: Choices((False, True)),
    "policy": lambda *_: Choices(tuple(p.value for p in Policy)),
}


def build_space(knob_space: KnobSpace, facts: SpaceFacts, params: dict[str, Domain] | None = None,
                fixed: Knobs | None = None) -> SearchSpace:  # fmt: skip
    """The target's default space narrowed or widened by `--param` and pinned by `--fix`."""
    params, fixed = dict(params or {}), dict(fixed or {})
    both = sorted(set(params) & set(fixed))
    if both:
        raise TuneError(f"{both[0]} is both searched (--param) and pinned (--fix); drop one")
    for name in params:
        knob_space.check_settable(name, "--param")
    for name in fixed:
        knob_space.check_settable(name, "--fix")
    base = knob_space.defaults
    domains = {
        name: make(facts, base, params, fixed)
        for name, make in DEFAULT_DOMAINS.items()
        if name in knob_space.settable and name not in fixed
    }
    domains.update(params)
    ordered = {name: domains[name] for name in KNOBS if name in domains}
    return SearchSpace(ordered, fixed, facts.block_size, facts.max_model_len, base)


def parse_param(text: str) -> tuple[str, Domain]:
    """`NAME=v1,v2` (choices) or `NAME=lo..hi` (an integer range) from `--param`."""
    k, value = _split(text, "--param")
    if ".." in value:
        if k.kind is not KnobKind.INT:
            raise TuneError(
                f"--param {text!r}: {k.name} is not an integer knob; list its values, "
                f"e.g. {k.name}={k.example()}"
            )
        lo_text, _, hi_text = value.partition("..")
        low, high = k.parse(lo_text), k.parse(hi_text)
        if low > high:
            raise TuneError(f"--param {text!r}: {low} > {high}; write the range as low..high")
        return k.name, IntRange(low, high, log=k.log_scale)
    return k.name, Choices(tuple(dict.fromkeys(k.parse(v) for v in value.split(","))))


def parse_fix(text: str) -> tuple[str, Any]:
    """`NAME=v` from `--fix`."""
    k, value = _split(text, "--fix")
    return k.name, k.parse(value)


def _split(text: str, flag: str) -> tuple[Any, str]:
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not value:
        raise TuneError(f"{flag} {text!r} is malformed; write NAME=VALUE, e.g. {flag} policy=...")
    try:
        return knob(name), value
    except TuneError as exc:
        raise TuneError(f"{flag} {text!r}: {exc}") from None


def _describe(domain: Domain) -> str:
    if isinstance(domain, Choices):
        return ", ".join(str(v) for v in domain.values)
    if isinstance(domain, IntRange):
        return f"{domain.low}..{domain.high}" + (" (log)" if domain.log else "")
    return f"off, or {domain.low:.3g}..{domain.high:.3g} of the budget (log)"


def _largest(domain: Domain | None, default: int) -> int:
    if isinstance(domain, IntRange):
        return domain.high
    if isinstance(domain, Choices):
        return max(domain.values)
    return default


def _round_to_block(value: float, block: int) -> int:
    return max(block, round(value / block) * block)


def _pow2_ceil(value: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, value))))
