"""`loadgen`: replay a workload against a server (or the built-in engine) and judge it by an SLO."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from loadgen.arrivals import ArrivalKind, arrival_offsets
from loadgen.cli_args import DEFAULT_NUM_REQUESTS, build_parser
from loadgen.cli_target import TargetMeta, open_target
from loadgen.errors import LoadgenError
from loadgen.output import prepare_out_dir, write_out
from loadgen.report import RunInfo, build_result, print_tables
from loadgen.runner import replay
from loadgen.workers import run_event_loop
from loadgen.workloads import Workload, build_workload
from slo import SLOError, parse_slo


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_event_loop(_run(args))
    except (LoadgenError, SLOError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


async def _run(args: argparse.Namespace) -> int:
    # A typo fails before any work; an empty --slo is a typo too, not "no SLO".
    slo = parse_slo(args.slo) if args.slo is not None else None
    _check_args(args)
    if args.out is not None:
        prepare_out_dir(args.out)
    target, engine, meta = await open_target(args)
    try:
        wl = _workload(args, meta.max_model_len, meta.vocab_size)
        for note in wl.notes:  # before the run: it may be long, and the user may want to stop
            print(f"loadgen: {note}", file=sys.stderr, flush=True)
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
    # Printed first: should writing --out still fail (a full disk), the numbers are on screen.
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        from rich.console import Console

        print_tables(result, Console())
    if args.out is not None:
        write_out(Path(args.out), res, result)
    return 0


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
        on_long=args.on_long,
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
        workload_notes=wl.notes,
    )


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


__all__ = ["build_parser", "main"]
