"""`replay`: send requests at absolute scheduled times, watch the loop's lag, collect records."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence

from loadgen.arrivals import MAX_SCHEDULE_S
from loadgen.errors import LoadgenError
from loadgen.progress import Counters, progress_display
from loadgen.schedule import (
    DEFAULT_LAG_TOLERANCE_S,
    ReplayResult,
    frozen_gc,
    run_schedule,
    summarize,
)
from loadgen.stop import StopRule
from loadgen.target import Target
from loadgen.workers import replay_in_workers
from loadgen.workloads import RequestSpec

WORKERS_PER_CORE = 4
START_DELAY_S = 0.05  # room to create the first tasks before the first scheduled send

__all__ = ["DEFAULT_LAG_TOLERANCE_S", "ReplayResult", "replay"]


async def replay(
    target: Target,
    requests: Sequence[RequestSpec],
    offsets: Sequence[float],
    warmup: int = 0,
    timeout_s: float = 60.0,
    progress: bool = False,
    *,
    workers: int = 1,
    lag_tolerance_s: float = DEFAULT_LAG_TOLERANCE_S,
    stop: StopRule | None = None,
) -> ReplayResult:
    """Send `requests[i]` at `offsets[i]` seconds after the start; one record per request.

    Send times are absolute (start + offset), never relative sleeps, so a late send does not
    delay the ones after it. The first `warmup` requests are flagged `warmup=True`; slo leaves
    them out of every metric. `workers > 1` spreads the schedule over that many processes.
    A `stop` rule may end the replay early (one process only: it must see every request).
    """
    _validate(requests, offsets, warmup, timeout_s, workers, lag_tolerance_s)
    if workers > 1 and stop is not None:
        raise LoadgenError("a stop rule must see every request; use workers=1 with it")
    if workers > 1:
        return await replay_in_workers(
            target, requests, offsets, warmup, timeout_s, progress, workers, lag_tolerance_s
        )
    counters = Counters()
    await target.open()
    try:
        with progress_display(progress, len(requests), counters), frozen_gc():
            start = time.monotonic() + START_DELAY_S
            scheduled = [start + off for off in offsets]
            flags = [i < warmup for i in range(len(requests))]
            records, lag, stopped = await run_schedule(
                target, requests, scheduled, flags, timeout_s, counters, stop
            )
    finally:
        await target.close()
    return summarize(records, start, [lag.samples_s], lag_tolerance_s, 1,
                     target.chunk_times_from_loop, stopped)  # fmt: skip


def _validate(
    requests: Sequence[RequestSpec],
    offsets: Sequence[float],
    warmup: int,
    timeout_s: float,
    workers: int,
    lag_tolerance_s: float,
) -> None:
    if not requests:
        raise LoadgenError("no requests to replay; build a workload with num_requests >= 1")
    _check_offsets(offsets, len(requests))
    if isinstance(warmup, bool) or not 0 <= warmup < len(requests):
        raise LoadgenError(
            f"warmup={warmup!r} is invalid; use 0 <= warmup < {len(requests)} (the request count)"
        )
    if not timeout_s > 0:
        raise LoadgenError(f"timeout={timeout_s!r} s is invalid; use a positive number of seconds")
    _check_workers(workers, len(requests))
    if not lag_tolerance_s > 0:
        raise LoadgenError(f"lag tolerance {lag_tolerance_s!r} s is invalid; use a positive number")


def _check_offsets(offsets: Sequence[float], num_requests: int) -> None:
    if len(offsets) != num_requests:
        raise LoadgenError(
            f"{len(offsets)} arrival offsets for {num_requests} requests; pass one per request"
        )
    if any(o < 0 for o in offsets):  # NaN passes here and fails below
        raise LoadgenError("arrival offsets must be >= 0; build them with arrival_offsets()")
    # A rate typed as 1e-300 or a time scale as 1e300 would sleep until the process is killed.
    last = max(offsets, key=lambda o: math.inf if math.isnan(o) else o)
    if not last <= MAX_SCHEDULE_S:
        raise LoadgenError(
            f"the last request would be sent {last:.3g} s after the first, past the "
            f"{MAX_SCHEDULE_S / 86400:g}-day limit of a replay; raise the rate or lower the "
            "trace's time scale"
        )


def _check_workers(workers: int, num_requests: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise LoadgenError(f"workers={workers!r} is invalid; use an integer >= 1")
    # Each worker is a process with its own event loop: a few per core is already more than
    # can run at once, and more than the requests would sit idle. 100000 would try to spawn
    # them all.
    cores = os.cpu_count() or 1
    most = min(WORKERS_PER_CORE * cores, num_requests)
    if workers > most:
        raise LoadgenError(
            f"workers={workers} is more than can help here ({cores} CPU cores, "
            f"{num_requests} requests); use at most {most}"
        )
