"""`TuneSettings`: everything one `tune` run was asked to do, as the CLI parsed it."""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen import Workload, build_workload
from tuner.errors import TuneError
from tuner.measure.draws import LevelMix
from tuner.measure.meter import LevelSettings
from tuner.search.space import Domain, parse_fix, parse_param
from tuner.search.starting import Scenario
from tuner.search.study import SamplerName
from tuner.targets.base import ReplayPlan, TargetFacts
from tuner.targets.factory import TargetOptions

# Defaults sized so that `tune --slo tpot_p99=30ms` on the CPU `tiny` preset ends in under ten
# minutes on two cores: a level is 8 s of arrivals plus the drain (~12 s in all), the default
# config needs ~5 levels and a pruned trial one. docs/tuner.md shows the arithmetic.
DEFAULT_LEVEL_S = 8.0
DEFAULT_REL_TOL = 0.15
MIN_REQUESTS_PER_LEVEL = 20
# With --engine vllm a level holds at least this many requests. A p99 over a few dozen is its
# worst request or two, and which request is worst depends on where the long prompts of that
# arrival draw land: on real vLLM the same config's capacity moved 10-18 req/s between searches
# with 8 s levels. benchmarks/level_noise.py measures how the spread falls with the level size.
# 640, not 320: promises measured on 320-request levels missed on independent 320-request
# windows (loadgen's seeds carry 0.93-1.16x the mix's prefill); at 640 (0.99-1.04x) runs 18-20
# held on 7 of 9, the default missing on 9 of 9 beside them (docs/tuner.md, "Level size").
MIN_REQUESTS_PER_LEVEL_VLLM = 640
# Fresh draws each top config is re-measured on. With --engine vllm one more: its confirmed
# capacity must hold on each draw, and a run's promise is judged on fresh server starts.
DEFAULT_REPEATS = 1
DEFAULT_REPEATS_VLLM = 2
# A candidate that misses its confirmation steps its rate down at most this often, each on a
# fresh draw of its own.
MAX_STEPS_DOWN = 2
# The seeded request list levels take their prefix from (enough for 8 s at 50 req/s on a CPU;
# a GPU serves far more).
DEFAULT_NUM_REQUESTS = 400
DEFAULT_NUM_REQUESTS_GPU = 4000
# The burst that calibrates the first start rate.
BURST_REQUESTS = 40
BURST_REQUESTS_GPU = 200
DEFAULT_TIME_BUDGET_S = 540.0
# Against real vLLM a config costs a 45-75 s server start besides its levels.
DEFAULT_TIME_BUDGET_VLLM_S = 1200.0
DEFAULT_TRIALS = 100  # the time budget, not the count, ends a default run
# With the simulator, the built-in engine's run aims to recommend within this (see `goal_s`).
DEFAULT_GOAL_S = 120.0
# Workers on a shared RDB storage beat every 20 s; a trial silent for three beats is taken as
# dead, failed and queued again (Optuna's heartbeat; docs/cluster.md).
DEFAULT_HEARTBEAT_S = 20


@dataclass
class TuneSettings:
    """One run's settings; JSON-friendly so a resume and `tune report` can read them back."""

    slo: str
    workload: str = "mixed"
    num_requests: int | None = None  # request list size; None: 400 on CPU, 4000 on a GPU
    level_s: float = DEFAULT_LEVEL_S  # seconds of arrivals per level; 0: the whole list
    min_requests: int | None = None  # per level; None: 20, or 640 with --engine vllm
    level_mix: str = LevelMix.STRATIFIED.value  # which requests a level takes (measure/draws.py)
    workload_seed: int = 0
    arrival: str = "poisson"
    burstiness: float = 1.0
    # engine: "builtin" (engine_lite in process) or "vllm" (started per config)
    engine: str = "builtin"
    vllm_command: str | None = None
    vllm_args: str = ""
    model: str = "tiny"
    device: str = "auto"
    dtype: str = "auto"
    kv_cache_memory_gb: float | None = None
    max_model_len: int | None = None
    # search
    params: list[str] = field(default_factory=list)  # --param texts
    fixed: list[str] = field(default_factory=list)  # --fix texts
    trials: int = DEFAULT_TRIALS
    time_budget_s: float = DEFAULT_TIME_BUDGET_S
    rate_rps: float | None = None
    repeats: int = DEFAULT_REPEATS
    top_k: int = 3
    sampler: str = SamplerName.TPE.value
    # "sim": screen the space on a simulator fitted to the target, then verify the best for
    # real; "real": search on the target alone.
    fidelity: str = "sim"
    profile: str | None = None  # a `tune profile` file instead of fitting at the start
    verify_top: int = 2  # screened configs measured on the target besides the default
    # Once a verified config held its simulated gain, another is verified only if the run can
    # still end within this many seconds. None: DEFAULT_GOAL_S on the built-in engine, none
    # against a server (a start alone costs 45-75 s); 0: none.
    goal_s: float | None = None
    robust: bool = False  # choose the confirmed config with the best worst case in the band
    seed: int = 0
    n_startup_trials: int = 5
    budget_sweep: bool = True  # queue the coarse budget sweep before the sampler
    start_rps: float | None = None  # None: calibrated from a burst of the request list
    growth: float = 2.0
    rel_tol: float = DEFAULT_REL_TOL
    min_rps: float | None = None  # None: the first trial's start / 8
    max_levels: int = 8
    scenario: str | None = None
    request_timeout_s: float = 120.0
    # storage
    run_dir: str | None = None
    storage: str | None = None
    study_name: str | None = None
    heartbeat_s: int = DEFAULT_HEARTBEAT_S  # a shared RDB storage: seconds between heartbeats
    # other targets
    launch: str | None = None
    url: str | None = None
    served_model: str | None = None
    endpoint: str = "completions"
    prometheus_url: str | None = None
    prometheus_interval_s: float = 5.0
    launch_timeout_s: float = 600.0
    synthetic_s: float | None = None  # --synthetic: each level waits this long, measures nothing

    def __post_init__(self) -> None:
        if self.num_requests is not None:
            _positive("num_requests", self.num_requests, integer=True)
        if self.min_requests is not None:
            _positive("min_requests", self.min_requests, integer=True)
        _one_of("level-mix", self.level_mix, LevelMix)
        if self.level_s < 0:
            raise TuneError(f"--level-seconds {self.level_s} is invalid; use 0 or more")
        _positive("trials", self.trials, integer=True)
        _positive("time_budget_s", self.time_budget_s)
        if self.start_rps is not None:
            _positive("start_rate", self.start_rps)
        if self.min_rps is not None:
            _positive("min_rate", self.min_rps)
        _positive("max_levels", self.max_levels, integer=True)
        _positive("top_k", self.top_k, integer=True)
        if self.rate_rps is not None:
            _positive("rate", self.rate_rps)
        if self.repeats < 0:
            raise TuneError(f"--repeats {self.repeats} is invalid; use 0 or more")
        if self.growth <= 1:
            raise TuneError(f"--growth {self.growth} is invalid; use a factor above 1, e.g. 2")
        if not 0 < self.rel_tol < 1:
            raise TuneError(f"--rate-tolerance {self.rel_tol} is invalid; use e.g. 0.1 (10%)")
        _positive("heartbeat_interval", self.heartbeat_s, integer=True)
        if self.synthetic_s is not None:
            _positive("synthetic", self.synthetic_s)
        _one_of("sampler", self.sampler, SamplerName)
        if self.fidelity not in ("sim", "real"):
            raise TuneError(f"--fidelity {self.fidelity!r} is invalid; use sim or real")
        _positive("verify_top", self.verify_top, integer=True)
        if self.goal_s is not None and not self.goal_s >= 0:
            raise TuneError(f"--goal {self.goal_s!r} is invalid; use a duration such as 2m, or 0")
        if self.engine not in ("builtin", "vllm"):
            raise TuneError(f"--engine {self.engine!r} is invalid; use builtin or vllm")
        if self.engine == "vllm" and (self.launch or self.url):
            raise TuneError("--engine vllm starts vLLM itself; drop --launch / --url")
        if self.scenario is not None:
            _one_of("scenario", self.scenario, Scenario)
        self.param_domains()
        self.fixed_values()

    def param_domains(self) -> dict[str, Domain]:
        return dict(parse_param(p) for p in self.params)

    def fixed_values(self) -> dict[str, Any]:
        return dict(parse_fix(f) for f in self.fixed)

    def resolved_min_requests(self) -> int:
        if self.min_requests is not None:
            return self.min_requests
        return MIN_REQUESTS_PER_LEVEL_VLLM if self.engine == "vllm" else MIN_REQUESTS_PER_LEVEL

    def resolved_num_requests(self, device: str) -> int:
        if self.num_requests is not None:
            return self.num_requests
        base = DEFAULT_NUM_REQUESTS_GPU if device.startswith("cuda") else DEFAULT_NUM_REQUESTS
        # Room for disjoint draws of the shortest level: the search's, each re-measurement and
        # each step down, so a confirmation's draw never wraps round to the search's requests.
        draws = 1 + self.repeats + MAX_STEPS_DOWN
        return max(base, draws * self.resolved_min_requests())

    def resolved_goal_s(self) -> float | None:
        """The run's time goal in seconds, None when it has none."""
        if self.goal_s is not None:
            return self.goal_s or None
        builtin = self.engine == "builtin" and not (self.launch or self.url or self.synthetic_s)
        return DEFAULT_GOAL_S if builtin else None

    def burst_requests(self, device: str) -> int:
        return BURST_REQUESTS_GPU if device.startswith("cuda") else BURST_REQUESTS

    def resolved_run_dir(self) -> Path:
        if self.run_dir is None:
            self.run_dir = str(Path("results") / time.strftime("tune-%Y%m%d-%H%M%S"))
        return Path(self.run_dir)

    def target_options(self, log_dir: Path) -> TargetOptions:
        engine = {"device": self.device, "dtype": self.dtype,
                  "kv_cache_memory_gb": self.kv_cache_memory_gb}  # fmt: skip
        return TargetOptions(
            model=self.model, engine=engine, launch=self.launch, url=self.url,
            kind=self.engine, vllm_command=self.vllm_command, vllm_args=self.vllm_args,
            served_model=self.served_model, endpoint=self.endpoint,
            max_model_len=self.max_model_len, prometheus_url=self.prometheus_url,
            prometheus_interval_s=self.prometheus_interval_s,
            launch_timeout_s=self.launch_timeout_s, log_dir=log_dir,
            synthetic_level_s=self.synthetic_s,
        )  # fmt: skip

    def level_settings(self) -> LevelSettings:
        """How each load level replays the request list (what `tune`'s meter measures with)."""
        return LevelSettings(arrival=self.arrival, burstiness=self.burstiness,
                             seed=self.workload_seed, duration_s=self.level_s or None,
                             min_requests=self.resolved_min_requests(),
                             mix=LevelMix(self.level_mix),
                             replay=ReplayPlan(timeout_s=self.request_timeout_s))  # fmt: skip

    def request_list(self, facts: TargetFacts) -> Workload:
        """The seeded request list every level draws from, sized for the target (what `tune`
        replays, and what a benchmark re-measuring its configs must replay too)."""
        return build_workload(self.workload, seed=self.workload_seed,
                              num_requests=self.resolved_num_requests(facts.device),
                              max_model_len=facts.max_model_len,
                              vocab_size=facts.vocab_size)  # fmt: skip

    def resolved_study_name(self) -> str:
        return self.study_name or f"tune-{self.workload}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        # A run saved before levels drew by stratum took contiguous stretches; it resumes so.
        data = {"level_mix": LevelMix.CONTIGUOUS.value, **data}
        return cls(**{k: v for k, v in data.items() if k in known})


def _one_of(name: str, value: str, choices: type[enum.StrEnum]) -> None:
    if value not in {c.value for c in choices}:
        listed = ", ".join(c.value for c in choices)
        raise TuneError(f"--{name} {value!r} is invalid; use {listed}")


def _positive(name: str, value: float, integer: bool = False) -> None:
    flag = "--" + name.replace("_", "-")
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise TuneError(f"{flag} {value!r} is invalid; use a whole number >= 1")
    if not value > 0:
        raise TuneError(f"{flag} {value!r} is invalid; use a positive number")
