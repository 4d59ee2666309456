"""`tune bench` suite files: which configs to measure, on what workload, how to compare them.

A suite is TOML so that it lives in the repository next to the CI workflow that runs it; the
format, with an example, is in docs/bench.md ("Suites"), and results/baselines/ holds one.
"""

from __future__ import annotations

import enum
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.bench.stats import parse_tolerance
from tuner.errors import TuneError

# Direction of each figure a suite may gate on: True when higher is better.
FIGURES: dict[str, bool] = {
    **dict.fromkeys(("capacity_rps", "saturation_rps", "saturation_tok_s", "request_goodput"),
                    True),
    **dict.fromkeys(("ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2el_p99_ms", "ttft_p50_ms",
                     "tpot_p50_ms", "itl_p50_ms", "e2el_p50_ms"), False),
}  # fmt: skip
# Sim mode's tolerance: its figures repeat exactly, so only float rounding is forgiven.
SIM_REL_TOL = 1e-9


class BenchMode(enum.StrEnum):
    """How figures are compared with the baseline."""

    ABSOLUTE = "absolute"
    RATIO = "ratio"
    SIM = "sim"  # virtual time on the simulator: one run, compared exactly


@dataclass(slots=True)
class BenchConfig:
    """One named engine configuration: scheduler knobs over the engine's defaults."""

    name: str
    knobs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class BenchSuite:
    """A parsed, validated suite file."""

    name: str
    mode: BenchMode
    reference: str | None
    repeats: int
    tolerance: float
    figures: list[str]
    target: dict[str, Any]
    workload: dict[str, Any]
    slo: str
    rate_rps: float
    configs: list[BenchConfig]

    def set_mode(self, mode: BenchMode) -> None:
        """Switch the mode (`--mode`); only ratio mode has a reference, the first by default."""
        self.mode = mode
        self.reference = None if mode is BenchMode.SIM else self.reference or self.configs[0].name

    @property
    def rounds(self) -> int:
        """Measurements per config: one in sim mode, where every repeat gives the same."""
        return 1 if self.mode is BenchMode.SIM else self.repeats

    @property
    def allowed_change(self) -> float:
        """The worsening a figure may show: only float rounding in sim mode (it is exact)."""
        return SIM_REL_TOL if self.mode is BenchMode.SIM else self.tolerance


def _require(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise TuneError(f"{where} needs `{key}`; see docs/bench.md (Suites) for the format")
    return table[key]


def _parse_configs(raw: Any, path: str) -> list[BenchConfig]:
    if not isinstance(raw, list) or not raw:
        raise TuneError(f"{path}: add at least one [[config]] table with a `name`")
    configs = []
    for i, table in enumerate(raw):
        knobs = dict(table)
        name = knobs.pop("name", None)
        if not isinstance(name, str) or not name:
            raise TuneError(f"{path}: [[config]] number {i + 1} needs a `name` string")
        configs.append(BenchConfig(name=name, knobs=knobs))
    names = [c.name for c in configs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TuneError(f"{path}: config names must be unique; {dupes} appear twice")
    return configs


def _parse_target(doc: dict[str, Any], mode: BenchMode, path: str) -> dict[str, Any]:
    """The [target] table; a sim suite's `profile` is resolved against the suite's folder."""
    target = dict(doc.get("target", {"model": "tiny"}))
    if "profile" in target:
        target["profile"] = str(Path(path).parent / str(target["profile"]))
    if mode is BenchMode.SIM:
        if "profile" not in target:
            raise TuneError(
                f'{path}: mode = "sim" needs [target] profile = "NAME.profile.json" (a '
                "cost-model profile, relative to the suite); see docs/bench.md (Sim mode)"
            )
        given = [k for k in ("repeats", "tolerance", "reference") if k in doc]
        if given:
            raise TuneError(f"{path}: sim mode has no {', '.join(given)} (one run in virtual "
                            "time, compared exactly); remove it")  # fmt: skip
    elif sum(k in target for k in ("model", "url", "launch")) != 1:
        raise TuneError(f"{path}: [target] needs exactly one of model, url, launch")
    return target


def parse_suite(text: str, path: str = "suite") -> BenchSuite:
    """Parse and validate a suite; every mistake is a one-line TuneError naming the key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TuneError(f"{path} is not valid TOML: {exc}") from None
    mode_raw = doc.get("mode", "ratio")
    try:
        mode = BenchMode(mode_raw)
    except ValueError:
        raise TuneError(f"{path}: mode = {mode_raw!r}; use 'ratio', 'absolute' or 'sim'") from None
    configs = _parse_configs(doc.get("config"), path)
    reference = doc.get("reference")
    if mode is BenchMode.RATIO:
        reference = reference or configs[0].name
        if reference not in {c.name for c in configs}:
            raise TuneError(f"{path}: reference = {reference!r} is not one of the [[config]] names")
    figures = list(doc.get("figures", ["capacity_rps", "tpot_p99_ms", "ttft_p99_ms"]))
    unknown = [f for f in figures if f not in FIGURES]
    if unknown:
        raise TuneError(f"{path}: unknown figures {unknown}; choose from {sorted(FIGURES)}")
    repeats = doc.get("repeats", 3)
    if not isinstance(repeats, int) or repeats < 1:
        raise TuneError(f"{path}: repeats = {repeats!r}; use a whole number >= 1 (3-5 is typical)")
    target = _parse_target(doc, mode, path)
    measure = doc.get("measure", {})
    rate = _require(measure, "rate_rps", f"{path} [measure]")
    if not isinstance(rate, int | float) or rate <= 0:
        raise TuneError(f"{path}: [measure] rate_rps = {rate!r}; use a positive req/s")
    return BenchSuite(
        name=str(doc.get("name", Path(path).stem)), mode=mode,
        reference=reference if mode is BenchMode.RATIO else None, repeats=repeats,
        tolerance=parse_tolerance(str(doc.get("tolerance", "5%"))), figures=figures,
        target=target, workload=dict(doc.get("workload", {"name": "mixed"})),
        slo=str(_require(measure, "slo", f"{path} [measure]")), rate_rps=float(rate),
        configs=configs,
    )  # fmt: skip


def load_suite(path: str | Path) -> BenchSuite:
    p = Path(path)
    if not p.is_file():
        raise TuneError(f"--suite {str(p)!r} does not exist; point it at a suite TOML file")
    return parse_suite(p.read_text(), str(p))
