"""Build the run's target from its settings, and the facts about it the search space needs."""

from __future__ import annotations

from dataclasses import dataclass

from engine_lite import EngineConfig, EngineLiteError
from tuner.errors import TuneError
from tuner.search.space import KNOB_ORDER
from tuner.settings import TuneSettings
from tuner.store.runfiles import RunFiles
from tuner.targets.base import BuiltinTarget, LaunchTarget, Target, UrlTarget
from tuner.targets.launch import LaunchSpec
from tuner.targets.prom import PrometheusProbe

# vLLM's KV block size on GPUs (CacheConfig.block_size): the budget rounds to it for --launch.
VLLM_BLOCK_SIZE = 16
DEFAULT_LAUNCH_MODEL_LEN = 8192


@dataclass(frozen=True)
class TargetFacts:
    """What the tuner must know about the engine before it can build a space and a workload."""

    kind: str  # "builtin" | "launch" | "url"
    description: str
    model: str
    device: str
    max_model_len: int
    vocab_size: int
    block_size: int
    # In process, chunk times come from the engine itself, so a lagging client loop cannot
    # distort them; over HTTP it can, and such a level must not count as a pass.
    require_schedule: bool


def open_target(settings: TuneSettings, files: RunFiles) -> tuple[Target, TargetFacts]:
    """The built-in engine (weights load here, once), a --launch command, or a --url."""
    prom = None
    if settings.prometheus_url:
        prom = PrometheusProbe(settings.prometheus_url, settings.prometheus_interval_s)
        prom.check()
    if settings.launch:
        return _launch(settings, files, prom)
    if settings.url:
        model = _served_model(settings)
        target = UrlTarget(settings.url, model, settings.endpoint, prometheus=prom)
        return target, _http_facts(settings, "url", target.description, model)
    return _builtin(settings)


def _builtin(settings: TuneSettings) -> tuple[Target, TargetFacts]:
    try:
        config = EngineConfig(
            model=settings.model,
            device=settings.device,
            dtype=settings.dtype,
            kv_cache_memory_gb=settings.kv_cache_memory_gb,
            max_model_len=settings.max_model_len,
        )
        target = BuiltinTarget(config)
    except EngineLiteError as exc:
        raise TuneError(str(exc)) from None
    engine = target.engine
    device, block_size = _device_and_block(config, engine)
    facts = TargetFacts(
        kind="builtin",
        description=target.description,
        model=settings.model,
        device=device,
        max_model_len=engine.max_model_len,
        vocab_size=engine.vocab_size,
        block_size=block_size,
        require_schedule=False,
    )
    return target, facts


def _device_and_block(config: EngineConfig, engine: object) -> tuple[str, int]:
    """The device engine_lite runs on and its KV block size.

    The block size comes from the engine when it exposes one; else the config's, else 16
    (engine_lite's PyTorch backend and vLLM's GPU default). The budget only rounds to it.
    """
    import torch

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    name = device
    if device.startswith("cuda"):
        name = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    block = getattr(engine, "block_size", None) or config.block_size or VLLM_BLOCK_SIZE
    return name, int(block)


def _launch(
    settings: TuneSettings, files: RunFiles, prom: PrometheusProbe | None
) -> tuple[Target, TargetFacts]:
    assert settings.launch is not None
    url = settings.url or "http://127.0.0.1:8000"
    model = _served_model(settings)
    spec = LaunchSpec(settings.launch, url=url, model=model)
    used = spec.fields() & set(KNOB_ORDER)
    if not used:
        raise TuneError(
            "--launch has no knob placeholder, so every trial would be the same server; add "
            "e.g. --max-num-batched-tokens {max_num_batched_tokens} to the command"
        )
    asked = set(settings.param_domains()) - used
    if asked:
        name = sorted(asked)[0]
        raise TuneError(f"--param {name} is searched but the --launch command has no {{{name}}}")
    target = LaunchTarget(
        spec,
        url,
        model,
        settings.endpoint,
        prometheus=prom,
        health_timeout_s=settings.launch_timeout_s,
        log_dir=files.root / "server-logs",
    )
    return target, _http_facts(settings, "launch", target.description, model)


def _served_model(settings: TuneSettings) -> str:
    if not settings.served_model:
        raise TuneError(
            "--served-model is required with --launch or --url: the model name the server "
            "expects in requests (e.g. meta-llama/Llama-3.1-8B-Instruct)"
        )
    return settings.served_model


def _http_facts(settings: TuneSettings, kind: str, description: str, model: str) -> TargetFacts:
    return TargetFacts(
        kind=kind,
        description=description,
        model=model,
        device="remote",
        max_model_len=settings.max_model_len or DEFAULT_LAUNCH_MODEL_LEN,
        # Prompt token ids must be valid for the served model; ids below 4096 are valid in
        # every Llama-family vocabulary, and lengths, not ids, drive serving time.
        vocab_size=4096,
        block_size=VLLM_BLOCK_SIZE,
        require_schedule=True,
    )


def launch_searched_knobs(settings: TuneSettings) -> set[str] | None:
    """With --launch only the knobs the command takes can be searched (None: all of them)."""
    if not settings.launch:
        return None
    return LaunchSpec(settings.launch, url="http://x:1", model="m").fields() & set(KNOB_ORDER)
