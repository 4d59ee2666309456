"""The knobs a study searches, their ranges, and `--param` / `--fix` parsing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine_lite import EngineConfig, Policy
from tuner.errors import TuneError

# vLLM SchedulerConfig names; the order is the order a trial suggests them in, so a knob that
# bounds another (chunking, the budget) is known before the knob it bounds.
KNOB_ORDER = (
    "max_num_seqs",
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
    "policy",
)
INT_KNOBS = frozenset(KNOB_ORDER) - {"enable_chunked_prefill", "policy"}

# Optuna parameter names of the default threshold dimension: a switch, and the cap as a fraction
# of the budget (a cap above the budget never binds, so a fraction keeps every sample meaningful).
THRESHOLD_SWITCH = "long_prefill"
THRESHOLD_FRACTION = "long_prefill_fraction"
MAX_PARTIAL_PREFILLS = 4
# Knobs whose useful values span orders of magnitude.
_LOG_KNOBS = ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold")


class Suggester(Protocol):
    """The part of `optuna.Trial` (or `optuna.trial.FixedTrial`) a space needs."""

    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int: ...
    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


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


@dataclass(frozen=True)
class SearchSpace:
    """Searched knobs with their domains, pinned knobs, and the model facts that bound them."""

    domains: dict[str, Domain]
    fixed: dict[str, Any]
    block_size: int
    max_model_len: int
    longest_prompt: int
    base: dict[str, Any] = field(default_factory=lambda: EngineConfig().scheduler_knobs())

    def suggest(self, trial: Suggester) -> dict[str, Any]:
        """The seven scheduler knobs of one trial, valid for `EngineConfig`."""
        knobs = {**self.base, **self.fixed}
        for name in KNOB_ORDER:
            domain = self.domains.get(name)
            if domain is None or not self._applies(name, knobs):
                continue
            knobs[name] = self._suggest_one(trial, name, domain, knobs)
        return self.normalise(knobs)

    def to_params(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """Optuna params that make `suggest` reproduce `knobs` (for enqueueing a known config)."""
        params: dict[str, Any] = {}
        for name in KNOB_ORDER:
            domain = self.domains.get(name)
            if domain is None or not self._applies(name, knobs):
                continue
            value = knobs[name]
            if _is_switched(name, domain):
                params[THRESHOLD_SWITCH] = "on" if value else "off"
                if value and isinstance(domain, BudgetFraction):
                    params[THRESHOLD_FRACTION] = value / knobs["max_num_batched_tokens"]
                elif value:
                    params[name] = value
            else:
                params[name] = str(value) if isinstance(value, Policy) else value
        return params

    def contains(self, knobs: dict[str, Any]) -> bool:
        """True when every searched knob's value lies in its domain and pinned knobs match."""
        if any(knobs.get(k) != v for k, v in self.fixed.items()):
            return False
        for name, domain in self.domains.items():
            value = knobs[name]
            if isinstance(domain, Choices) and value not in domain.values:
                return False
            if isinstance(domain, IntRange) and not domain.low <= value <= domain.high:
                return False
            if isinstance(domain, BudgetFraction) and value:
                frac = value / knobs["max_num_batched_tokens"]
                if not domain.low <= frac <= domain.high:
                    return False
        return True

    def expressible(self, knobs: dict[str, Any]) -> bool:
        """Can a trial of this space run `knobs`? Out-of-range integers can be enqueued (Optuna
        takes them as they are); a value missing from a list of choices cannot."""
        return all(
            knobs[name] in domain.values
            for name, domain in self.domains.items()
            if isinstance(domain, Choices)
        )

    def normalise(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """Apply the rules that tie knobs together, as vLLM's SchedulerConfig checks them."""
        out = dict(knobs)
        out["policy"] = Policy(out["policy"])
        budget = _round_to_block(out["max_num_batched_tokens"], self.block_size)
        budget = max(budget, out["max_num_seqs"])
        if not out["enable_chunked_prefill"]:
            # Without chunking a whole prompt must fit one step.
            budget = max(budget, self.max_model_len)
            out["max_num_partial_prefills"] = 1
        out["max_num_batched_tokens"] = budget
        out["long_prefill_token_threshold"] = min(
            out["long_prefill_token_threshold"], budget, self.max_model_len
        )
        out["max_long_partial_prefills"] = min(
            out["max_long_partial_prefills"], out["max_num_partial_prefills"]
        )
        return out

    def describe(self) -> dict[str, str]:
        """One human-readable line per searched knob, for reports and `--help` output."""
        return {name: _describe(domain) for name, domain in self.domains.items()}

    def _applies(self, name: str, knobs: dict[str, Any]) -> bool:
        partial = ("max_num_partial_prefills", "max_long_partial_prefills")
        if name in partial and not knobs["enable_chunked_prefill"]:
            return False
        if name == "max_long_partial_prefills":
            return knobs["max_num_partial_prefills"] > 1
        return True

    def _suggest_one(self, trial: Suggester, name: str, domain: Domain, knobs: dict) -> Any:
        if isinstance(domain, Choices):
            choices = [str(v) if isinstance(v, Policy) else v for v in domain.values]
            return trial.suggest_categorical(name, choices)
        switched = _is_switched(name, domain)
        if switched and trial.suggest_categorical(THRESHOLD_SWITCH, ["off", "on"]) == "off":
            return 0
        if isinstance(domain, IntRange):
            low = max(domain.low, 1) if switched else domain.low
            return trial.suggest_int(name, low, domain.high, log=domain.log)
        frac = trial.suggest_float(THRESHOLD_FRACTION, domain.low, domain.high, log=True)
        budget = _round_to_block(knobs["max_num_batched_tokens"], self.block_size)
        return max(self.block_size, _round_to_block(frac * budget, self.block_size))


def _is_switched(name: str, domain: Domain) -> bool:
    """The threshold's "off" (0) is a switch of its own, not the bottom of a log range."""
    if isinstance(domain, BudgetFraction):
        return True
    return (
        name == "long_prefill_token_threshold" and isinstance(domain, IntRange) and domain.low == 0
    )


def build_space(
    *,
    block_size: int,
    max_model_len: int,
    longest_prompt: int,
    params: dict[str, Domain] | None = None,
    fixed: dict[str, Any] | None = None,
) -> SearchSpace:
    """The default space narrowed or widened by `--param` and pinned by `--fix`."""
    params = dict(params or {})
    fixed = dict(fixed or {})
    both = sorted(set(params) & set(fixed))
    if both:
        raise TuneError(f"{both[0]} is both searched (--param) and pinned (--fix); drop one")
    base = EngineConfig().scheduler_knobs()
    max_seqs = _largest(params.get("max_num_seqs"), fixed.get("max_num_seqs", base["max_num_seqs"]))
    budget_low = _round_up(max(256, max_seqs), block_size)
    # "A few times the longest prompt", and never below vLLM's default so the default is inside.
    budget_high = max(base["max_num_batched_tokens"], _pow2_ceil(4 * longest_prompt), budget_low)
    domains: dict[str, Domain] = {
        "max_num_batched_tokens": IntRange(budget_low, budget_high, log=True),
        "long_prefill_token_threshold": BudgetFraction(),
        "max_num_partial_prefills": IntRange(1, MAX_PARTIAL_PREFILLS),
        "max_long_partial_prefills": IntRange(1, MAX_PARTIAL_PREFILLS),
        "policy": Choices(tuple(p.value for p in Policy)),
    }
    domains.update(params)
    for name in fixed:
        domains.pop(name, None)
    return SearchSpace(domains, fixed, block_size, max_model_len, longest_prompt, base)


def parse_param(text: str) -> tuple[str, Domain]:
    """`NAME=v1,v2` (choices) or `NAME=lo..hi` (an integer range) from `--param`."""
    name, value = _split(text, "--param")
    if ".." in value:
        if name not in INT_KNOBS:
            raise TuneError(
                f"--param {text!r}: {name} is not an integer knob; list its values, "
                f"e.g. {name}={_example_choices(name)}"
            )
        lo_text, _, hi_text = value.partition("..")
        low, high = _parse_value(name, lo_text), _parse_value(name, hi_text)
        if low > high:
            raise TuneError(f"--param {text!r}: {low} > {high}; write the range as low..high")
        return name, IntRange(low, high, log=name in _LOG_KNOBS)
    values = tuple(dict.fromkeys(_parse_value(name, v) for v in value.split(",")))
    return name, Choices(values)


def parse_fix(text: str) -> tuple[str, Any]:
    """`NAME=v` from `--fix`."""
    name, value = _split(text, "--fix")
    return name, _parse_value(name, value)


def _split(text: str, flag: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not value:
        raise TuneError(f"{flag} {text!r} is malformed; write NAME=VALUE, e.g. {flag} policy=...")
    if name not in KNOB_ORDER:
        raise TuneError(f"{flag} {text!r}: unknown knob {name!r}; knobs: {', '.join(KNOB_ORDER)}")
    return name, value


def _parse_value(name: str, text: str) -> Any:
    text = text.strip()
    if name == "policy":
        try:
            return Policy(text)
        except ValueError:
            raise TuneError(
                f"{name}={text!r} is invalid; use one of {_example_choices(name)}"
            ) from None
    if name == "enable_chunked_prefill":
        lowered = text.lower()
        if lowered in ("true", "on", "1", "yes"):
            return True
        if lowered in ("false", "off", "0", "no"):
            return False
        raise TuneError(f"{name}={text!r} is invalid; use true or false")
    try:
        value = int(text)
    except ValueError:
        raise TuneError(f"{name}={text!r} is invalid; use an integer") from None
    minimum = 0 if name == "long_prefill_token_threshold" else 1
    if value < minimum:
        raise TuneError(f"{name}={value} is invalid; use an integer >= {minimum}")
    return value


def _example_choices(name: str) -> str:
    if name == "policy":
        return ",".join(p.value for p in Policy)
    return "true,false" if name == "enable_chunked_prefill" else "1,2"


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


def _round_up(value: int, block: int) -> int:
    return -(-value // block) * block


def _pow2_ceil(value: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, value))))
