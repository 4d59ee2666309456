"""The scheduler knobs the tuner knows, and the knob space each target declares.

The catalogue is the tuner's one list of knob names, labels, value types and vLLM flags. A
target declares its `KnobSpace`: the knobs it has, their values when it is told nothing (the
default config every comparison is against), and which it can change between trials.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine_lite import Policy
from tuner.errors import TuneError

Knobs = dict[str, Any]  # knob name -> value (a `Policy` for policy); one trial's config
_BOOLS = {"true": True, "on": True, "1": True, "yes": True,
          "false": False, "off": False, "0": False, "no": False}  # fmt: skip


class KnobKind(enum.Enum):
    INT = "int"
    BOOL = "bool"
    POLICY = "policy"


@dataclass(frozen=True, slots=True)
class Knob:
    """One scheduler knob: its name, label, value type and how vLLM spells it."""

    name: str
    label: str  # short name in reports and the live display
    kind: KnobKind = KnobKind.INT
    minimum: int = 1
    log_scale: bool = False  # useful values span orders of magnitude
    vllm_flag: str | None = None  # None: `vllm serve` has no such flag

    def parse(self, text: str) -> Any:
        """A value from `--param` / `--fix`; errors name the value and the fix."""
        text = text.strip()
        if self.kind is KnobKind.POLICY and text in {p.value for p in Policy}:
            return Policy(text)
        if self.kind is KnobKind.BOOL and text.lower() in _BOOLS:
            return _BOOLS[text.lower()]
        if self.kind is not KnobKind.INT:
            raise TuneError(f"{self.name}={text!r} is invalid; use one of {self.example()}")
        try:
            value = int(text)
        except ValueError:
            raise TuneError(f"{self.name}={text!r} is invalid; use an integer") from None
        if value < self.minimum:
            raise TuneError(f"{self.name}={value} is invalid; use an integer >= {self.minimum}")
        return value

    def example(self) -> str:
        """Example values for an error message."""
        if self.kind is KnobKind.POLICY:
            return ",".join(p.value for p in Policy)
        return "true,false" if self.kind is KnobKind.BOOL else "1,2"

    def to_json(self, value: Any) -> Any:
        return value.value if isinstance(value, Policy) else value

    def from_json(self, value: Any) -> Any:
        return Policy(value) if self.kind is KnobKind.POLICY else value

    def to_arg(self, value: Any) -> str:
        """The value as one command-line argument (a --launch placeholder)."""
        return str(value).lower() if isinstance(value, bool) else str(self.to_json(value))


# Suggestion order: a knob that bounds another (the budget, chunking) comes before it.
CATALOGUE: tuple[Knob, ...] = (
    Knob("max_num_batched_tokens", "budget", log_scale=True,
         vllm_flag="--max-num-batched-tokens"),
    Knob("max_num_seqs", "seqs", log_scale=True, vllm_flag="--max-num-seqs"),
    Knob("enable_chunked_prefill", "chunked", KnobKind.BOOL,
         vllm_flag="--enable-chunked-prefill"),
    Knob("long_prefill_token_threshold", "threshold", minimum=0, log_scale=True,
         vllm_flag="--long-prefill-token-threshold"),
    # vLLM 0.32: floors the threshold at budget / (running + waiting).
    Knob("long_prefill_token_threshold_adaptive", "adaptive", KnobKind.BOOL,
         vllm_flag="--long-prefill-token-threshold-adaptive"),
    # An engine_lite extension (DESIGN.md): vLLM 0.32 has only decode_first's order.
    Knob("policy", "policy", KnobKind.POLICY),
)  # fmt: skip
KNOBS: dict[str, Knob] = {k.name: k for k in CATALOGUE}


def knob(name: str) -> Knob:
    """The catalogue entry for `name`; a one-line error listing the known knobs otherwise."""
    if name not in KNOBS:
        raise TuneError(f"unknown knob {name!r}; knobs: {', '.join(KNOBS)}")
    return KNOBS[name]


def knobs_to_json(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """A config as JSON (Optuna attributes, reports): enums become their values."""
    return {name: KNOBS[name].to_json(value) for name, value in knobs.items()}


def knobs_from_json(data: Mapping[str, Any]) -> Knobs:
    return {name: KNOBS[name].from_json(value) for name, value in data.items()}


@dataclass(frozen=True, slots=True)
class KnobSpace:
    """The knobs one target has, what it runs when told nothing, and what it can change."""

    defaults: Knobs  # every knob the target has, at the value it runs untouched
    settable: frozenset[str]  # the knobs it can change between trials
    default_source: str  # where `defaults` come from, e.g. a row of vLLM's device table
    refusal: str = "this target cannot change {name}"  # why not, with {name} filled in

    def __post_init__(self) -> None:
        unknown = sorted((set(self.defaults) | self.settable) - set(KNOBS))
        if unknown or not self.settable <= set(self.defaults):
            raise ValueError(f"knob space names unknown or default-less knobs: {unknown}")

    def check_settable(self, name: str, flag: str) -> None:
        """A one-line error when `flag` asks to search or pin a knob the target cannot set."""
        knob(name)
        if name not in self.settable:
            raise TuneError(f"{flag} {name}: {self.refusal.format(name=name)}")

    def complete(self, knobs: Mapping[str, Any]) -> Knobs:
        """The full config a target runs for `knobs`: knobs left out mean the defaults (not the
        previous trial's values); a knob the target cannot set must keep its default."""
        for name, value in knobs.items():
            if name not in self.settable and value != self.defaults.get(name):
                raise TuneError(f"{name}={value}: {self.refusal.format(name=name)}")
        return {**self.defaults, **knobs}

    def to_json(self) -> dict[str, Any]:
        settable = [k for k in KNOBS if k in self.settable]
        return {"default_config": knobs_to_json(self.defaults),
                "default_source": self.default_source, "settable": settable}  # fmt: skip
