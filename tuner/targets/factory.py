"""Build the target a run or a bench suite names: the built-in engine, `--launch` or `--url`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_lite import EngineConfig, EngineLiteError
from tuner.errors import TuneError
from tuner.targets.base import Target
from tuner.targets.builtin import BuiltinTarget
from tuner.targets.http import LaunchTarget, PrometheusProbe, UrlTarget
from tuner.targets.launch import LaunchSpec
from tuner.targets.synthetic import SyntheticTarget

DEFAULT_LAUNCH_URL = "http://127.0.0.1:8000"


@dataclass(slots=True)
class TargetOptions:
    """Everything that picks and configures a target (from `tune` flags or a suite's [target])."""

    model: str = "tiny"  # built-in engine: preset or folder
    engine: dict[str, Any] = field(default_factory=dict)  # other EngineConfig options
    launch: str | None = None
    url: str | None = None
    served_model: str | None = None
    endpoint: str = "completions"
    max_model_len: int | None = None
    prometheus_url: str | None = None
    prometheus_interval_s: float = 5.0
    launch_timeout_s: float = 600.0
    log_dir: Path | None = None
    kind: str = "builtin"  # or "vllm"
    vllm_command: str | None = None
    vllm_args: str = ""
    synthetic_level_s: float | None = None  # --synthetic: a stand-in that measures nothing


def open_target(options: TargetOptions) -> Target:
    """The target the options name: a synthetic stand-in, or a real engine or server."""
    if options.synthetic_level_s is not None:
        return SyntheticTarget(options.synthetic_level_s)
    return _open_engine(options)


def _open_engine(options: TargetOptions) -> Target:
    """The built-in engine (weights load here, once), a --launch command, or a --url."""
    prom = None
    if options.prometheus_url:
        prom = PrometheusProbe(options.prometheus_url, options.prometheus_interval_s)
        prom.check()
    if options.kind == "vllm":
        from tuner.targets.vllm import VllmOptions, VllmTarget

        return VllmTarget(VllmOptions(options.model, options.vllm_command, options.served_model,
                                      options.max_model_len, options.launch_timeout_s,
                                      options.log_dir, options.vllm_args,
                                      options.engine.get("dtype", "auto")))  # fmt: skip
    if options.launch:
        url = options.url or DEFAULT_LAUNCH_URL
        spec = LaunchSpec(options.launch, url=url, model=_served_model(options))
        return LaunchTarget(spec, options.endpoint, prom, options.launch_timeout_s,
                            options.log_dir, options.max_model_len)  # fmt: skip
    if options.url:
        return UrlTarget(options.url, _served_model(options), options.endpoint, prom,
                         options.max_model_len)  # fmt: skip
    try:
        config = EngineConfig(model=options.model, max_model_len=options.max_model_len,
                              **options.engine)  # fmt: skip
    except (EngineLiteError, TypeError) as exc:
        raise TuneError(str(exc)) from None
    return BuiltinTarget(config)


def _served_model(options: TargetOptions) -> str:
    if not options.served_model:
        raise TuneError(
            "--served-model is required with --launch or --url: the model name the server "
            "expects in requests (e.g. meta-llama/Llama-3.1-8B-Instruct)"
        )
    return options.served_model
