"""`loadgen`: replay a workload against a server (or the built-in engine) and judge it by an SLO."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from loadgen.arrivals import ArrivalKind, arrival_offsets
from loadgen.cli_args import (
    DEFAULT_NUM_REQUESTS,
    ENGINE_INT_FLAGS,
    ENGINE_OTHER_FLAGS,
    build_parser,
)
from loadgen.client import HttpTarget
from loadgen.errors import LoadgenError
from loadgen.presets import REFERENCE_MODEL_LEN
from loadgen.records import RequestRecord
from loadgen.report import RunInfo, build_result, print_tables, record_rows
from loadgen.runner import ReplayResult, replay
from loadgen.target import Target
from loadgen.workers import run_event_loop
from loadgen.workloads import DEFAULT_VOCAB_SIZE, Workload, build_workload
from slo import SLOError, parse_slo


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_event_loop(_run(args))
    except ValueError as exc:  # every user error is one of the project's ValueErrors
        if not _is_user_error(exc):
            raise
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


async def _run(args: argparse.Namespace) -> int:
    slo = parse_slo(args.slo) if args.slo else None  # a typo fails before any work
    _check_args(args)
    target, engine, meta = await _open_target(args)
    try:
        wl = _workload(args, meta.max_model_len, meta.vocab_size)
        offsets = _offsets(args, wl)
        progress = not args.no_progress and sys.stderr.isatty()
        res = await replay(
            target,
            wl.requests,
            offsets,
            warmup=args.warmup,
            timeout_s=args.timeout,
            progress=progress,
            workers=args.workers,
            lag_tolerance_s=args.lag_tolerance_ms / 1e3,
        )
    finally:
        if engine is not None:
            await engine.shutdown()
    result = build_result(_info(args, wl, meta), res, slo)
    if args.out:
        _write_out(Path(args.out), res, result)
    if args.json:
        print(json.dumps(result))
    else:
        from rich.console import Console

        print_tables(result, Console())
    return 0


@dataclasses.dataclass(slots=True)
class TargetMeta:
    """What the target says about its model, and the backend name for the result."""

    max_model_len: int
    vocab_size: int
    model_id: str
    backend: str


async def _open_target(args: argparse.Namespace) -> tuple[Target, Any, TargetMeta]:
    """The target, the engine to shut down (--builtin) and what it says about the model."""
    if args.builtin:
        from engine_lite import AsyncEngine, EngineConfig

        knobs = {f: getattr(args, f) for f in (*ENGINE_INT_FLAGS, *ENGINE_OTHER_FLAGS)}
        knobs = {k: v for k, v in knobs.items() if v is not None}
        if args.max_model_len:
            knobs["max_model_len"] = args.max_model_len
        engine = AsyncEngine(_engine_config(EngineConfig, args.model or "tiny", knobs))
        await engine.start()
        from loadgen.inprocess import InProcessTarget

        meta = TargetMeta(
            engine.max_model_len, engine.vocab_size, engine.config.model, "engine-lite-inprocess"
        )
        return InProcessTarget(engine), engine, meta
    probe = HttpTarget(args.url, args.model, args.endpoint, api_key=args.api_key)
    await probe.open()  # one clear line if the server cannot be reached
    card = await probe.server_info()
    await probe.close()
    model = args.model or card.get("id")
    meta = TargetMeta(
        max_model_len=int(args.max_model_len or card.get("max_model_len") or REFERENCE_MODEL_LEN),
        vocab_size=args.vocab_size or DEFAULT_VOCAB_SIZE,
        model_id=model or "",
        backend="openai" if args.endpoint == "completions" else "openai-chat",
    )
    return HttpTarget(args.url, model, args.endpoint, api_key=args.api_key), None, meta


def _engine_config(config_cls: Any, model: str, knobs: dict[str, Any]) -> Any:
    """The validated engine config; its errors speak of our flags, not of field names."""
    from engine_lite.errors import EngineLiteError
    from engine_lite.server.args import as_flag

    try:
        return config_cls(model=model, **knobs)
    except EngineLiteError as exc:
        raise EngineLiteError(as_flag(str(exc))) from None


def _workload(args: argparse.Namespace, max_model_len: int, vocab_size: int) -> Workload:
    start, count = 0, args.num_requests
    if args.slice:
        start, count = _parse_slice(args.slice)
    if count is None and args.workload != "trace":
        count = DEFAULT_NUM_REQUESTS
    return build_workload(
        args.workload,
        num_requests=None if count is None else count + args.warmup,
        seed=args.seed,
        max_model_len=max_model_len,
        vocab_size=args.vocab_size or vocab_size,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        trace_path=args.trace_file,
        trace_format=args.trace_format,
        trace_start=start,
        length_scale=args.length_scale,
    )


def _offsets(args: argparse.Namespace, wl: Workload) -> list[float]:
    kind = _arrival(args)
    rate = args.rate
    if rate is None and kind != ArrivalKind.TRACE.value:
        rate = math.inf  # vllm bench serve's default request rate
    return arrival_offsets(
        kind, rate, len(wl.requests), args.seed, args.burstiness, wl.timestamps_s, args.time_scale
    )


def _arrival(args: argparse.Namespace) -> str:
    if args.arrival:
        return str(args.arrival)
    if args.workload == "trace":
        return ArrivalKind.TRACE.value
    return ArrivalKind.GAMMA.value if args.burstiness != 1.0 else ArrivalKind.POISSON.value


def _info(args: argparse.Namespace, wl: Workload, meta: TargetMeta) -> RunInfo:
    return RunInfo(
        backend=meta.backend,
        model_id=meta.model_id,
        workload=wl.name,
        fingerprint=wl.fingerprint(),
        arrival=_arrival(args),
        request_rate=args.rate if args.rate is not None or args.workload == "trace" else math.inf,
        burstiness=args.burstiness,
        seed=args.seed,
        warmup=args.warmup,
    )


def _write_out(out: Path, res: ReplayResult, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    derived = {row["index"]: row for row in record_rows(res.records)}
    with (out / "records.jsonl").open("w", encoding="utf-8") as fh:
        for rec in res.records:
            row = {**dataclasses.asdict(rec), **derived.get(rec.index, {})}
            fh.write(json.dumps(_json_row(rec, row)) + "\n")
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def _json_row(rec: RequestRecord, row: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }


def _parse_slice(text: str) -> tuple[int, int | None]:
    start_txt, sep, end_txt = text.partition(":")
    try:
        start = int(start_txt) if start_txt else 0
        end = int(end_txt) if end_txt else None
    except ValueError:
        raise LoadgenError(
            f"--slice {text!r} is invalid; use START:END row numbers, e.g. 0:200"
        ) from None
    if not sep or start < 0 or (end is not None and end <= start):
        raise LoadgenError(f"--slice {text!r} is invalid; use START:END with 0 <= START < END")
    return start, None if end is None else end - start


def _check_args(args: argparse.Namespace) -> None:
    if args.builtin and args.workers != 1:
        raise LoadgenError("--workers needs --url: the built-in engine runs in this process")
    for flag in ("num_requests", "max_model_len", "vocab_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise LoadgenError(
                f"--{flag.replace('_', '-')} {value} is invalid; use an integer >= 1"
            )
    if args.warmup < 0:
        raise LoadgenError(f"--warmup {args.warmup} is invalid; use an integer >= 0")


def _is_user_error(exc: ValueError) -> bool:
    kinds: tuple[type[BaseException], ...] = (LoadgenError, SLOError)
    engine_errors = sys.modules.get("engine_lite.errors")
    if engine_errors is not None:
        kinds += (engine_errors.EngineLiteError,)
    return isinstance(exc, kinds)


__all__ = ["build_parser", "main"]
