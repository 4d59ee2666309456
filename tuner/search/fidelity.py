"""Multi-fidelity search: screen in virtual time, measure the best for real, refit, repeat.

1. The default config is measured for real first. The built-in engine reports every step it
   serves; with a burst of decode batches from 96 requests to one and a level on a small
   budget (chunks of every size), the simulator's step-time model is fitted on them; vLLM's
   is fitted on its clients' spans, the burst's too. A `tune profile` file can give it instead.
2. Screen: every config of a grid gets a capacity search on the simulator.
3. Verify: the best screened config not yet measured is measured for real, its rate search
   starting at its simulated capacity. The model is refitted on every step (or level) measured
   so far and the space screened again; that repeats `verify_top` times.
4. Check: simulated against measured, for every verified config. The run falls back to
   searching on the target for real, and says so, when the simulator overstated a verified
   config's gain over the default by more than the bound: then it ranks configs above the
   default that are not, and its choice of what to measure cannot be trusted. Its capacity error
   is reported too, but does not decide: the speed of a shared machine drifts between
   measurements minutes apart (budget 256 on the same draw: 5.3, 6.8, 8.9 and 8.9 req/s in four
   searches on one 2-core VM), which moves a config and the default alike in the model but not
   in one real reading; and a config measured better than simulated costs the search nothing,
   since the recommendation is always a measured one.

The recommendation is always a measured config.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

import optuna

from engine_lite.costmodel import CostModel, fit
from engine_lite.probe import ChunkProbe
from engine_lite.sim import SimEngine
from tuner.measure.meter import Meter
from tuner.search.space import SearchSpace
from tuner.sim.calibrate import OWN_STEP_SCALES, WIDE_SCALES, RealLevel, StepLog, refit
from tuner.sim.calibration import burst_level, calibration_level
from tuner.sim.chunk_probe import described, probe_alone
from tuner.sim.profile import Profile
from tuner.sim.read_back import PRIOR, fit_served
from tuner.sim.screen import Screened, screen, screen_space
from tuner.sim.target import SimTarget
from tuner.store import attrs
from tuner.store.records import Role, TrialRecord
from tuner.store.runfiles import RunView
from tuner.targets.base import Target, TargetKind
from tuner.targets.knobs import Knobs, knobs_to_json

SIM_ERROR_BOUND = 0.2  # overstated gain over the default past which the search measures for real
RESCREEN_TOP = 24  # after a refit, the best configs so far are screened again
MIN_STEPS = 50


def key(knobs: Knobs) -> str:
    return json.dumps(knobs_to_json(knobs), sort_keys=True)


@dataclass(slots=True)
class Simulator:
    """The run's simulator: the target in virtual time, how it was fitted, what it screened."""

    target: Target  # the real one
    steps: StepLog | None  # the real engine's steps, when it reports them
    profile: Profile | None
    sim: SimTarget | None = None
    meter: Meter | None = None
    source: str = ""
    predicted: dict[str, float] = field(default_factory=dict)  # config key -> capacity
    default_rps: float = 0.0  # the default's simulated capacity under the current model
    screened: int = 0
    screen_s: float = 0.0
    ranked: list[Screened] = field(default_factory=list)
    fit_size: int = 0  # steps (or request spans) the model was fitted on
    fit_error: float = 0.0  # the fit's median (spans: mean) relative error on them
    fit_p90_error: float = 0.0
    chunk: ChunkProbe | None = None  # what a prefill chunk costs, measured apart (built-in)
    probed: bool = False
    verification_ended: str | None = None  # why no further config was verified, if not budget
    calibration: list[RealLevel] = field(default_factory=list)  # vLLM's burst: spans, not tail

    @classmethod
    def for_target(cls, target: Target, profile: Profile | None) -> Simulator | None:
        """None when the target offers no way to fit one (a server whose scheduler is not
        vLLM's, and no profile file)."""
        engine = getattr(target, "engine", None)  # the built-in engine reports its steps
        steps = None
        if engine is not None and hasattr(engine, "add_step_listener"):
            steps = StepLog()
            engine.add_step_listener(steps)
        if steps is None and profile is None and not _serves_like_vllm(target):
            return None
        return cls(target, steps, profile)

    def recording(self, on: bool) -> None:
        if self.steps is not None:
            self.steps.active, self.steps._last_end = on, None

    async def fit(self, meter: Meter, levels: list[RealLevel]) -> bool:
        """(Re)fit the model on the engine's steps, on what vLLM's clients saw, or from the
        profile, then scale it to the real levels; False when there is not enough to fit on."""
        await self._probe()
        fitted = self._fit_model(levels)
        if fitted is None:
            return False
        shape, model = fitted
        self.sim = SimTarget(self.target.facts, self.target.knobs, shape, model)
        rules = dataclasses.replace(meter.rules, require_schedule=False)
        self.meter = dataclasses.replace(meter, target=self.sim, clock=time.perf_counter,
                                         rules=rules, guard=None)  # fmt: skip
        if levels:
            # Scaled to the percentiles this target's levels show. A span fit (vLLM) matches
            # spans on average, while the SLO judges their tail: on vLLM CPU it put the
            # default's capacity at 37.5 req/s against 16.5 measured, and 20.2 once scaled
            # (x1.41). A fit on the engine's own steps reads the steps, not the way from a step
            # to the client: one such fit put budget 1024 at 5.76 req/s against 8.19 measured,
            # and 8.19 once scaled (x0.92) to the default's levels; it needs a narrower range.
            scales = OWN_STEP_SCALES if self.steps is not None else WIDE_SCALES
            refitted = await refit(self.sim, self.meter, levels, scales)
            self.source += (f", step time x{refitted.scale:.2f} and "
                            f"{refitted.model.request_overhead_s * 1e3:.1f} ms per request to "
                            f"match {len(levels)} real levels")  # fmt: skip
        return True

    async def _probe(self) -> None:
        """Once, on the built-in engine between levels: the cost of a prefill chunk, which
        serving steps leave unidentified (`engine_lite.probe`), on a quiet machine."""
        engine = getattr(self.target, "engine", None)
        if self.probed or self.steps is None or not hasattr(engine, "while_idle"):
            return
        self.probed = True
        self.chunk = await probe_alone(engine)

    @property
    def calibration_phase(self) -> str | None:
        """What `calibrate` runs (`tuner.sim.calibration`); None when it runs nothing."""
        if self.steps is not None:
            return "a decode burst and a level on a small budget: steps for the simulator"
        vllm = _serves_like_vllm(self.target) and not self.calibration
        return "a decode burst on the default: request spans for the simulator" if vllm else None

    async def calibrate(self, meter: Meter, space: SearchSpace, capacity_rps: float) -> None:
        """Once before the first fit: levels the steps log, or the span fit reads."""
        if self.steps is not None:
            await calibration_level(meter, space, capacity_rps)
        elif self.calibration_phase:
            self.calibration.append(await burst_level(meter, space))

    def _fit_model(self, levels: list[RealLevel]) -> tuple[SimEngine, CostModel] | None:
        if self.steps is not None and len(self.steps.samples) >= MIN_STEPS:
            engine: Any = self.target.engine
            shape = SimEngine(engine.num_kv_blocks, engine.block_size, engine.max_model_len)
            self.source = f"fitted on {len(self.steps.samples)} steps this engine served"
            if self.steps.rejected:
                self.source += f" ({self.steps.rejected} of levels measured again left out)"
            chunk = self.chunk
            report = fit(self.steps.samples, chunk.chunk_s if chunk else None,
                         chunk.context_s if chunk else 0.0)  # fmt: skip
            if chunk is not None:
                self.source += f"; {described(chunk)}"
            self.fit_size, self.fit_error = report.num_steps, report.median_rel_error
            self.fit_p90_error = report.p90_rel_error
            return shape, report.model
        if _serves_like_vllm(self.target) and levels:
            shape = self.target.sim_shape()  # type: ignore[attr-defined]
            start = self.profile.model_cost if self.profile is not None else PRIOR
            spans = fit_served([*levels, *self.calibration], shape, start)
            if spans is not None:
                self.fit_size, self.fit_error = spans.num_spans, spans.mean_rel_error
                self.fit_p90_error = spans.p90_rel_error
                burst = " and a decode burst" if self.calibration else ""
                self.source = (f"fitted on {spans.num_spans} request spans in {len(levels)} "
                               f"levels{burst} vLLM served (mean span error "
                               f"{spans.mean_rel_error:.0%})")  # fmt: skip
                return shape, spans.model
        if self.profile is not None:
            self.source = f"profile of {self.profile.engine} on {self.profile.device}"
            return self.profile.shape, self.profile.model_cost
        return None

    async def rescreen(self, space: SearchSpace, start_rps: float) -> list[Screened]:
        """The whole space the first time, then the best configs so far again."""
        assert self.sim is not None and self.meter is not None
        if not self.ranked:
            screening = await screen_space(self.sim, self.meter, space, start_rps)
        else:
            configs = [s.knobs for s in self.ranked[:RESCREEN_TOP]]
            screening = await screen(self.sim, self.meter, configs, start_rps)
        self.screen_s += screening.wall_s
        self.screened = max(self.screened, len(screening.ranked))
        # The default under this same model: what a verified config's simulated gain is over.
        default, before = space.default_config(), self.default_rps
        ours = next((s for s in screening.ranked if key(s.knobs) == key(default)), None)
        self.default_rps = (ours.capacity_rps if ours is not None
                            else await self.capacity_of(default, start_rps))  # fmt: skip
        seen = {key(s.knobs) for s in screening.ranked}
        stale = [s for s in self.ranked if key(s.knobs) not in seen]
        if stale and before and self.default_rps:
            # Not screened again: moved as the default moved under the new model, so a refit
            # that slows every config does not leave them ranked above those screened again.
            factor = self.default_rps / before
            stale = [dataclasses.replace(s, capacity_rps=s.capacity_rps * factor) for s in stale]
        self.ranked = sorted(screening.ranked + stale, key=lambda s: -s.capacity_rps)
        return self.ranked

    async def capacity_of(self, knobs: Knobs, start_rps: float) -> float:
        """One config's simulated capacity under the current model."""
        assert self.sim is not None and self.meter is not None
        return (await screen(self.sim, self.meter, [knobs], start_rps)).ranked[0].capacity_rps

    def next_unmeasured(self, space: SearchSpace, measured: list[Knobs]) -> Screened | None:
        """The best screened config not measured yet, as a trial would run it."""
        done = {key(space.normalise(k)) for k in measured}
        for s in self.ranked:
            knobs = space.as_queued(s.knobs)  # as the study will hold it
            if key(knobs) not in done and s.capacity_rps > 0:
                return dataclasses.replace(s, knobs=knobs)
        return None

    def queue(self, study: optuna.Study, space: SearchSpace, s: Screened) -> None:
        """Queue a screened config (from `next_unmeasured`) for verification."""
        self.predicted[key(s.knobs)] = s.capacity_rps
        role_attrs = attrs.role_attrs(Role.SCREENED, s.capacity_rps, self.default_rps or None)
        study.enqueue_trial(space.to_params(s.knobs), user_attrs=role_attrs)


def _serves_like_vllm(target: Target) -> bool:
    """vLLM runs our scheduler's rules (checked step by step), so its clients' timings can be
    fitted through it; any other server's scheduler is unknown."""
    return target.facts.kind is TargetKind.VLLM and hasattr(target, "sim_shape")


def real_levels(view: RunView) -> list[RealLevel]:
    """Every real level measured so far that kept its schedule, with every request it sent
    or scheduled: a level stopped early replays whole, since the requests cut short loaded the
    engine while the measured ones ran (those after the stop change nothing before it)."""
    return [RealLevel(t.knobs, run.rate_rps, run.records)
            for t in view.finished
            for run in view.files.search_runs(t, measured_only=False, carried=False)
            if run.schedule_ok and run.records]  # fmt: skip


def summary(simulator: Simulator, trials: list[TrialRecord], bound: float = SIM_ERROR_BOUND
            ) -> dict[str, Any]:  # fmt: skip
    """Simulated against measured for every verified config: its capacity error, and how far
    the simulator overstated its gain over the default (what decides the fall-back: every
    verified config's gain and capacity both overstated past `bound`)."""
    default = next((t for t in trials if t.role is Role.DEFAULT and t.capacity_rps), None)
    verified = []
    for t in trials:
        # As the trial was queued with it: a later refit and rescreen do not rewrite history.
        predicted = t.predicted_rps or simulator.predicted.get(key(t.knobs))
        if predicted is None or not t.finished:
            continue
        # Pruned, its capacity lies below its lowest failing rate: the miss is at least this.
        measured = t.capacity_rps or 0.0
        reached = measured or t.upper_bound_rps or 0.0
        err = abs(predicted - measured) / measured if measured else overshoot(predicted, reached)
        gain_err, allowed = None, max(reached, t.upper_bound_rps or 0.0)
        if default is not None and default.capacity_rps and t.predicted_default_rps:
            # A measured capacity is the last rate passed, one tolerance step (15%) below the
            # first that failed; the gain is overstated only past the most the measurement
            # allows (up to that failing rate, over the default's figure). Against the last
            # rate passed, a prediction exact to the rate (256 at 9.82 simulated and measured)
            # read a 23% overstated gain from the ladder's steps alone, and sent a built-in
            # run to 5 minutes of real search that found nothing better.
            gain_err = gain_error(predicted, t.predicted_default_rps, allowed, default.capacity_rps)
        verified.append({"config": knobs_to_json(t.knobs), "simulated_rps": predicted,
                         "measured_rps": measured or None, "capacity_err": err,
                         "simulated_default_rps": t.predicted_default_rps,
                         "gain_err": gain_err,
                         "overshoot": overshoot(predicted, allowed)})  # fmt: skip
    worst = max((v["capacity_err"] for v in verified), default=0.0)
    # A study queued before gains were recorded is judged on capacity. Else a config shows the
    # simulator right when its gain over the default or its capacity (simulated, against the
    # most its measurement allows) is within the bound: a refit that put the default at 6.18
    # req/s where it measured 9.05 read 432 / 224 adaptive's gain 27% overstated, its capacity
    # simulated at 11.79 and measured at 11.78; on gains alone the run fell back.
    judged = [min(v["gain_err"], v["overshoot"]) if v["gain_err"] is not None
              else v["capacity_err"] for v in verified]  # fmt: skip
    # The simulator only chooses what to measure, so it has failed when none of the configs it
    # chose held its promise: the search then falls back. One config it overstated beside one
    # it got right is a model that errs for some configs, and the refit after each verified
    # config learns from it; one built-in run verified 256 / 128 adaptive within 5% of its
    # simulated gain, then fell back on a second config overstated by 22%, and searched 250 s
    # for real to confirm a config 6% better.
    best_gain = min(judged, default=0.0)
    return {"configs_screened": simulator.screened, "configs_verified": len(verified),
            "screen_s": simulator.screen_s, "model_source": simulator.source,
            "chunk_probe": simulator.chunk.to_json() if simulator.chunk else None,
            "verified": verified, "max_error": worst,
            "max_gain_error": max(judged, default=0.0), "min_gain_error": best_gain,
            "error_bound": bound, "fell_back": best_gain > bound,
            "verification_ended": simulator.verification_ended}  # fmt: skip


def gain_error(predicted_rps: float, predicted_default_rps: float, allowed_rps: float,
               default_rps: float) -> float:  # fmt: skip
    """How far the simulated gain over the default (both simulated by the model the config was
    queued with) lies above the most the measurement allows (`allowed_rps`, up to its lowest
    failing rate, over the default's measured capacity): with the capacity's own overshoot,
    what decides the fall-back."""
    return overshoot(predicted_rps / predicted_default_rps, allowed_rps / default_rps)


def overshoot(predicted: float, reached: float) -> float:
    """How far a prediction lies above what was measured (0 when at or below it)."""
    return max(0.0, predicted / reached - 1) if reached else float("inf")
