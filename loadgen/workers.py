"""Worker processes: each runs its own event loop on a slice of the schedule, anchored to one
shared start time (`time.monotonic()` is one system-wide clock on Linux and macOS)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections.abc import Callable, Coroutine, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from loadgen.errors import LoadgenError
from loadgen.progress import progress_display
from loadgen.records import RequestRecord
from loadgen.schedule import ReplayResult, frozen_gc, run_schedule, summarize
from loadgen.target import Target
from loadgen.workloads import RequestSpec

T = TypeVar("T")
ANCHOR_DELAY_S = 0.2  # from "all workers ready" to the first scheduled send


def run_event_loop(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, on uvloop when it is installed (it keeps higher chunk rates on schedule)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class SharedCounters:
    """One worker's slots in a shared array: [sent, done] per worker."""

    __slots__ = ("_arr", "_i")

    def __init__(self, arr: Any, worker: int) -> None:
        self._arr, self._i = arr, 2 * worker

    @property
    def sent(self) -> int:
        return int(self._arr[self._i])

    @sent.setter
    def sent(self, value: int) -> None:
        self._arr[self._i] = value

    @property
    def done(self) -> int:
        return int(self._arr[self._i + 1])

    @done.setter
    def done(self, value: int) -> None:
        self._arr[self._i + 1] = value


class TotalCounters:
    """The parent's view: sums over workers."""

    def __init__(self, arr: Any) -> None:
        self._arr = arr

    @property
    def sent(self) -> int:
        return int(sum(self._arr[0::2]))

    @property
    def done(self) -> int:
        return int(sum(self._arr[1::2]))


async def replay_in_workers(
    target: Target,
    requests: Sequence[RequestSpec],
    offsets: Sequence[float],
    warmup: int,
    timeout_s: float,
    progress: bool,
    workers: int,
    lag_tolerance_s: float,
) -> ReplayResult:
    factory = target.worker_factory()
    if factory is None:
        raise LoadgenError(f"{target.description} runs inside this process; use workers=1")
    await target.open()  # fail fast, once, in one line, before any process starts
    await target.close()
    ctx = mp.get_context("spawn")  # no fork of a process that may hold threads or a loop
    arr = ctx.Array("q", 2 * workers, lock=False)
    order = sorted(range(len(requests)), key=offsets.__getitem__)
    conns, procs = [], []
    for w in range(workers):
        mine = order[w::workers]  # round-robin in time order: every worker sees the same load
        parent_end, child_end = ctx.Pipe()
        args = (
            factory,
            [requests[i] for i in mine],
            [offsets[i] for i in mine],
            [i < warmup for i in mine],
            timeout_s,
            child_end,
            arr,
            w,
        )
        proc = ctx.Process(target=_worker_main, args=args, daemon=True, name=f"loadgen-worker-{w}")
        proc.start()
        child_end.close()  # the child holds it now: a dead child then reads as EOF here
        conns.append(parent_end)
        procs.append(proc)
    try:
        await _gather_replies(conns, procs, "ready")
        start_s = time.monotonic() + ANCHOR_DELAY_S
        for conn in conns:
            conn.send(start_s)
        with progress_display(progress, len(requests), TotalCounters(arr)):
            replies = await _gather_replies(conns, procs, "done")
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
    records: list[RequestRecord] = [r for recs, _ in replies for r in recs]
    records.sort(key=lambda r: r.index)
    return summarize(records, start_s, [lags for _, lags in replies], lag_tolerance_s, workers)


async def _gather_replies(conns: list[Connection], procs: list[Any], want: str) -> list[Any]:
    loop = asyncio.get_running_loop()
    replies = await asyncio.gather(*(loop.run_in_executor(None, _recv, c) for c in conns))
    out = []
    for w, (kind, payload) in enumerate(replies):
        if kind == "error":
            for proc in procs:
                proc.terminate()
            raise LoadgenError(payload)
        if kind != want:
            for proc in procs:
                proc.terminate()
            raise LoadgenError(
                f"loadgen worker {w} exited unexpectedly (a script that starts workers needs an "
                "`if __name__ == '__main__':` guard); rerun with workers=1 to see why"
            )
        out.append(payload)
    return out


def _recv(conn: Connection) -> tuple[str, Any]:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return ("exited", None)


def _worker_main(
    factory: Callable[[], Target],
    specs: list[RequestSpec],
    offsets: list[float],
    warmup_flags: list[bool],
    timeout_s: float,
    conn: Connection,
    arr: Any,
    worker: int,
) -> None:
    run_event_loop(_worker(factory, specs, offsets, warmup_flags, timeout_s, conn, arr, worker))


async def _worker(
    factory: Callable[[], Target],
    specs: list[RequestSpec],
    offsets: list[float],
    warmup_flags: list[bool],
    timeout_s: float,
    conn: Connection,
    arr: Any,
    worker: int,
) -> None:
    target = factory()
    try:
        await target.open()
    except LoadgenError as exc:
        conn.send(("error", str(exc)))
        return
    try:
        with frozen_gc():
            conn.send(("ready", None))
            start_s = conn.recv()  # blocks this loop on purpose: nothing runs before the anchor
            scheduled = [start_s + off for off in offsets]
            counters = SharedCounters(arr, worker)
            records, lag, _ = await run_schedule(
                target, specs, scheduled, warmup_flags, timeout_s, counters
            )
    finally:
        await target.close()
    conn.send(("done", (records, lag.samples_s)))
