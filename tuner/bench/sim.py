"""`tune bench --mode sim`: the suite's profile as a target that serves in virtual time.

No engine loads and no model runs: engine_lite's real scheduler steps through the suite's
requests and each step lasts what the profile's cost model says, so identical code gives
identical figures and a change to the scheduling logic shows exactly. The facts and knob space
are the built-in engine's on the profile's device (the CPU), as `BuiltinTarget` declares them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from engine_lite import EngineConfig
from loadgen.workloads import DEFAULT_VOCAB_SIZE
from tuner.bench.suite import BenchSuite
from tuner.errors import TuneError
from tuner.sim.profile import Profile
from tuner.sim.target import SimTarget
from tuner.targets.base import TargetFacts, TargetKind
from tuner.targets.knobs import KNOBS, KnobSpace


@dataclass(frozen=True, slots=True)
class SuiteProfile:
    """A sim suite's profile as read, and what a baseline records of it."""

    path: Path
    profile: Profile
    content_hash: str  # sha256 of the canonical JSON: formatting does not count, values do

    def target(self) -> SimTarget:
        """The built-in engine's facts and knobs on the profile's engine shape and device."""
        p, shape = self.profile, self.profile.shape
        config, row = EngineConfig().resolved(shape.device, shape.max_model_len)
        defaults = {k: v for k, v in config.scheduler_knobs().items() if k in KNOBS}
        knobs = KnobSpace(defaults, frozenset(defaults), row.describe())
        # Simulated tokens are never looked at: the vocabulary is loadgen's default (tiny's);
        # virtual time has no client to lag, so no schedule is required (False).
        about = f"engine_lite {p.model}, simulated from {self.path.name}"
        facts = TargetFacts(TargetKind.BUILTIN, about, p.model, p.device, shape.max_model_len,
                            DEFAULT_VOCAB_SIZE, shape.block_size, False)  # fmt: skip
        return SimTarget(facts, knobs, shape, p.model_cost)


def load_profile(suite: BenchSuite) -> SuiteProfile:
    """The profile a sim suite's [target] names; every problem is one line naming the file."""
    raw = suite.target.get("profile")
    if not raw:
        raise TuneError(
            f'suite {suite.name}: sim mode needs [target] profile = "NAME.profile.json" (a '
            "cost-model profile, relative to the suite); see docs/bench.md (Sim mode)"
        )
    path = Path(str(raw))
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TuneError(
            f"suite {suite.name}: profile {path} cannot be read ({exc.strerror}); point [target] "
            "profile at a profile file (written by tune profile), relative to the suite"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TuneError(
            f"suite {suite.name}: profile {path} is not JSON ({exc}); write it again with tune "
            "profile"
        ) from None
    profile = Profile.from_json(data, f"profile {path}")
    if "model" in suite.target:
        profile.check_model(str(suite.target["model"]))
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return SuiteProfile(path, profile, hashlib.sha256(canonical.encode()).hexdigest()[:16])
