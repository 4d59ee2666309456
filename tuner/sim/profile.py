"""A profile: the step-time model of one engine on one device and model, in a file.

`tune profile` writes one; `tune --profile FILE` reads it, so a team can profile a GPU once
and screen for it on a laptop. The file names what it was measured on; a run refuses a
profile of another engine or model, and says which differs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine_lite.costmodel import CostModel, FitReport
from engine_lite.sim import SimEngine
from tuner.errors import TuneError

FORMAT = "chunked-prefill-tuner profile 1"


@dataclass(frozen=True, slots=True)
class Profile:
    engine: str  # "engine_lite 0.1.0" or "vLLM 0.32.0"
    device: str
    model: str
    model_cost: CostModel
    shape: SimEngine  # KV blocks, block size, max_model_len as the engine ran
    steps: int  # step samples the fit used
    median_rel_error: float  # of the fit, per step
    p90_rel_error: float
    created: str = ""

    @classmethod
    def of(cls, engine: str, device: str, model: str, fit: FitReport, shape: SimEngine) -> Profile:
        return cls(engine, device, model, fit.model, shape, fit.num_steps, fit.median_rel_error,
                   fit.p90_rel_error, time.strftime("%Y-%m-%dT%H:%M:%S"))  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        shape = asdict(self.shape)
        shape.pop("device", None)
        fit = {"steps": self.steps, "median_rel_error": self.median_rel_error,
               "p90_rel_error": self.p90_rel_error}  # fmt: skip
        return {"format": FORMAT, "engine": self.engine, "device": self.device,
                "model": self.model, "created": self.created,
                "cost_model": self.model_cost.to_json(), "shape": shape, "fit": fit}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> Profile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TuneError(f"{where} is not a profile written by `tune profile`; write one")
        try:
            fit = data["fit"]
            return cls(str(data["engine"]), str(data["device"]), str(data["model"]),
                       CostModel.from_json(data["cost_model"]), SimEngine(**data["shape"]),
                       int(fit["steps"]), float(fit["median_rel_error"]),
                       float(fit["p90_rel_error"]), str(data.get("created", "")))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise TuneError(
                f"{where} is malformed ({exc}); write it again with tune profile"
            ) from None

    def save(self, path: Path) -> None:
        try:
            path.write_text(json.dumps(self.to_json(), indent=2))
        except OSError as exc:
            raise TuneError(f"cannot write the profile to {path} ({exc.strerror})") from None

    @classmethod
    def load(cls, path: Path) -> Profile:
        try:
            return cls.from_json(json.loads(path.read_text()), str(path))
        except OSError as exc:
            raise TuneError(f"--profile {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise TuneError(
                f"--profile {path} is not JSON ({exc}); write it with tune profile"
            ) from None

    def check_model(self, model: str) -> None:
        """A profile holds one model's step times: another model's would rank configs by the
        wrong costs. (Another engine's is fine: the run refits its step-time scale to the
        target's own real levels, and says so.)"""
        if Path(self.model).name != Path(model).name:
            raise TuneError(
                f"--profile was measured on model {self.model!r}, this run serves {model!r}; "
                f"profile this model with tune profile --model {model}"
            )
