"""`replay`: send requests at absolute scheduled times, watch the loop's lag, collect records."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from loadgen.errors import LoadgenError
from loadgen.progress import Counters, progress_display
from loadgen.schedule import (
    DEFAULT_LAG_TOLERANCE_S,
    ReplayResult,
    frozen_gc,
    run_schedule,
    summarize,
)
from loadgen.target import Target
from loadgen.workers import replay_in_workers
from loadgen.workloads import RequestSpec

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
) -> ReplayResult:
    """Send `requests[i]` at `offsets[i]` seconds after the start; one record per request.

    Send times are absolute (start + offset), never relative sleeps, so a late send does not
    delay the ones after it. The first `warmup` requests are flagged `warmup=True`; slo leaves
    them out of every metric. `workers > 1` spreads the schedule over that many processes.
    """
    _validate(requests, offsets, warmup, timeout_s, workers, lag_tolerance_s)
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
            records, lag = await run_schedule(
                target, requests, scheduled, flags, timeout_s, counters
            )
    finally:
        await target.close()
    return summarize(
        records, start, [lag.samples_s], lag_tolerance_s, 1, target.chunk_times_from_loop
    )


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
    if len(offsets) != len(requests):
        raise LoadgenError(
            f"{len(offsets)} arrival offsets for {len(requests)} requests; pass one per request"
        )
    if any(not (math.isfinite(o) and o >= 0) for o in offsets):
        raise LoadgenError(
            "arrival offsets must be finite and >= 0; build them with arrival_offsets()"
        )
    if isinstance(warmup, bool) or not 0 <= warmup < len(requests):
        raise LoadgenError(
            f"warmup={warmup!r} is invalid; use 0 <= warmup < {len(requests)} (the request count)"
        )
    if not timeout_s > 0:
        raise LoadgenError(f"timeout={timeout_s!r} s is invalid; use a positive number of seconds")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise LoadgenError(f"workers={workers!r} is invalid; use an integer >= 1")
    if not lag_tolerance_s > 0:
        raise LoadgenError(f"lag tolerance {lag_tolerance_s!r} s is invalid; use a positive number")
