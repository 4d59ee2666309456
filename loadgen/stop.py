"""Ending a replay early: a rule told of each finished request says when the requests still to
come can no longer change what the replay shows, and the requests it leaves unmeasured are
marked as such (records still, never silently dropped)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from loadgen.records import RequestRecord

# The error of a request the replay stopped before it finished: not sent, or sent and cancelled.
# It is no verdict on the server, so evaluations leave such records out (`measured_part`).
STOPPED_REASON = "not measured: the replay stopped early"

Finished = Callable[[RequestRecord], bool]


class StopRule(Protocol):
    """Picklable (it travels to a client process); `watch` makes one replay's fresh state."""

    def watch(self, records: Sequence[RequestRecord]) -> Finished | None:
        """Called once with every record of the replay before the first send. Returns what is
        told of each finished request (True: stop now), or None when this rule cannot stop
        this replay."""


def mark_stopped(records: Iterable[RequestRecord], now_s: float) -> int:
    """Mark every record not yet finished as stopped; how many were."""
    n = 0
    for r in records:
        if not r.success and r.error is None:
            r.fail(STOPPED_REASON, now_s)
            n += 1
    return n


def was_stopped(record: RequestRecord) -> bool:
    return not record.success and record.error == STOPPED_REASON


def measured_part(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The records a stopped replay measured (all of them when it was not stopped)."""
    return [r for r in records if not was_stopped(r)]
