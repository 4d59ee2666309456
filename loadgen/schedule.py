"""One event loop's share of a replay: dispatch at absolute times, watch the loop, summarize.

Both the single-process runner and each worker process run `run_schedule`; the parent folds
their records and lag samples into one `ReplayResult` with `summarize`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from loadgen.lag import LoopLagMonitor
from loadgen.progress import MutableCounters
from loadgen.records import RequestRecord
from loadgen.stop import Finished, StopRule, mark_stopped
from loadgen.target import Target
from loadgen.workloads import RequestSpec

DEFAULT_LAG_TOLERANCE_S = 0.010


@dataclass(slots=True)
class ReplayResult:
    """Records of one replay and whether the client kept its schedule.

    `schedule_ok` is False when the p99 of the loop's timer lag or of the send lag (actual
    minus scheduled send time) exceeded `lag_tolerance_s`: the client, not the server, was
    the bottleneck, and latencies measured in such a run cannot be trusted. `notes` says why.
    """

    records: list[RequestRecord]
    start_s: float
    max_loop_lag_s: float
    p99_loop_lag_s: float
    max_send_lag_s: float
    p99_send_lag_s: float
    lag_tolerance_s: float
    workers: int = 1
    notes: list[str] = field(default_factory=list)
    # Seconds after the start at which a stop rule ended the replay (None: it ran to the end);
    # the requests it left unfinished are marked (loadgen.stop).
    stopped_s: float | None = None

    @property
    def schedule_ok(self) -> bool:
        return not self.notes

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Freeze the heap for the run, as vLLM does before a benchmark
    (vllm.utils.gc_utils.freeze_gc_heap): collections of long-lived objects would otherwise
    pause the loop mid-measurement. No full collection first: with torch loaded it takes a
    sizeable fraction of a second and frees tensor memory that the in-process engine then
    faults back in, which halved its measured throughput on a 2-core CPU."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def run_schedule(
    target: Target,
    specs: Sequence[RequestSpec],
    scheduled_s: Sequence[float],
    warmup_flags: Sequence[bool],
    timeout_s: float,
    counters: MutableCounters,
    stop: StopRule | None = None,
) -> tuple[list[RequestRecord], LoopLagMonitor, float | None]:
    """Dispatch each spec at its absolute `scheduled_s` (monotonic) in this event loop; with a
    `stop` rule, end once it says so: no more sends, the requests in flight cancelled. The
    third value is when it stopped (monotonic), or None."""
    records = [
        RequestRecord(s.index, s.class_name, s.prompt_len, s.output_len, t, warmup=w)
        for s, t, w in zip(specs, scheduled_s, warmup_flags, strict=True)
    ]
    finished = stop.watch(records) if stop is not None else None
    halt = asyncio.Event()
    monitor = LoopLagMonitor()
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []
    monitor.start()
    try:
        for i in sorted(range(len(specs)), key=scheduled_s.__getitem__):
            prepared = target.prepare(specs[i])
            # A loop may wake a little early (uvloop's timers have 1 ms steps): sleep again. A
            # halt is seen at the next wake-up: plain sleeps keep the send times exact.
            while (delay := scheduled_s[i] - time.monotonic()) > 0 and not halt.is_set():
                await _sleep(delay, halt if finished is not None else None)
            if halt.is_set():
                break
            one = _one(target, specs[i], prepared, records[i], timeout_s, counters, finished, halt)
            tasks.append(loop.create_task(one))
            counters.sent += 1
        if finished is None:
            await asyncio.gather(*tasks)
        else:
            await _until_halted(tasks, halt, monitor)
    finally:
        await monitor.stop()
    stopped = time.monotonic()
    if not halt.is_set() or not mark_stopped(records, stopped):
        return records, monitor, None  # stopped at the last request: nothing was cut
    return records, monitor, stopped


# A wait for the next send longer than this also wakes on a halt (a low rate would otherwise
# keep a stopped level open until its next arrival); shorter ones are plain sleeps, whose
# wake-up the send times rest on.
HALT_AWARE_SLEEP_S = 0.25


async def _sleep(delay: float, halt: asyncio.Event | None) -> None:
    if halt is None or delay < HALT_AWARE_SLEEP_S:
        await asyncio.sleep(delay)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(halt.wait(), delay - HALT_AWARE_SLEEP_S / 2)


async def _until_halted(tasks: list[asyncio.Task[None]], halt: asyncio.Event,
                        monitor: LoopLagMonitor) -> None:  # fmt: skip
    """Wait for every task, or cancel those left once `halt` is set. The loop's lag while
    they unwind measures nothing, so the monitor's samples end at the halt."""
    everything = asyncio.gather(*tasks, return_exceptions=True)
    halted = asyncio.ensure_future(halt.wait())
    try:
        await asyncio.wait({everything, halted}, return_when=asyncio.FIRST_COMPLETED)
        if halt.is_set():
            for task in tasks:
                task.cancel()  # a task done already ignores it
            await monitor.stop()
        for outcome in await everything:  # cancellations are expected (not `Exception`s)
            if isinstance(outcome, Exception):
                raise outcome
    except BaseException:
        everything.cancel()  # this replay was cancelled: so are its requests
        raise
    finally:
        halted.cancel()


async def _one(
    target: Target,
    spec: RequestSpec,
    prepared: object,
    record: RequestRecord,
    timeout_s: float,
    counters: MutableCounters,
    finished: Finished | None = None,
    halt: asyncio.Event | None = None,
) -> None:
    try:
        await target.send(spec, prepared, record, timeout_s)
    except Exception as exc:  # a client bug must not end the run: it becomes a failed record
        record.fail(f"client error: {type(exc).__name__}: {exc}", time.monotonic())
    finally:
        counters.done += 1
    if finished is not None and halt is not None and finished(record):
        halt.set()


def summarize(
    records: list[RequestRecord],
    start_s: float,
    lag_samples: list[list[float]],
    tolerance_s: float,
    workers: int,
    judge_loop_lag: bool = True,
    stopped_s: float | None = None,
) -> ReplayResult:
    """Fold loop-lag samples (one list per process) and send lags into a `ReplayResult`.

    Loop lag only condemns a run whose chunk arrival times are stamped by the loop (HTTP); the
    in-process engine stamps its own tokens, and its late sends show up as send lag.
    """
    loop_lags = np.asarray([x for s in lag_samples for x in s] or [0.0])
    send_lags = np.asarray(
        [r.sent_s - r.scheduled_s for r in records if math.isfinite(r.sent_s)] or [0.0]
    )
    p99_loop, p99_send = float(np.percentile(loop_lags, 99)), float(np.percentile(send_lags, 99))
    remedy = (
        "use more --workers or a lower rate"
        if judge_loop_lag
        else "the engine's step thread kept the event loop from running; lower the rate"
    )
    notes = []
    if judge_loop_lag and p99_loop > tolerance_s:
        notes.append(
            f"client event loop lagged (p99 {p99_loop * 1e3:.1f} ms > {tolerance_s * 1e3:g} ms): "
            f"chunk timestamps may be late; {remedy}"
        )
    if p99_send > tolerance_s:
        notes.append(
            f"client fell behind its schedule (p99 send lag {p99_send * 1e3:.1f} ms > "
            f"{tolerance_s * 1e3:g} ms); {remedy}"
        )
    return ReplayResult(
        records=records,
        start_s=start_s,
        max_loop_lag_s=float(loop_lags.max()),
        p99_loop_lag_s=p99_loop,
        max_send_lag_s=float(send_lags.max()),
        p99_send_lag_s=p99_send,
        lag_tolerance_s=tolerance_s,
        workers=workers,
        notes=notes,
        stopped_s=None if stopped_s is None else stopped_s - start_s,
    )
