"""`Target`: what the replay runner drives (an HTTP server or the in-process engine)."""

from __future__ import annotations

from typing import Any, Protocol

from loadgen.records import RequestRecord
from loadgen.workloads import RequestSpec


class Target(Protocol):
    """A server the runner sends requests to.

    The runner calls `open()` once before a replay and `close()` after it; `prepare(spec)` off
    the critical path, before the request's scheduled time; and `send(...)` at that time.
    `send` stamps `record.sent_s` right before the request leaves, fills the chunks, usage and
    status, and never raises for a failed request: failures are records.
    """

    description: str
    # True when chunk arrival times are stamped by the event loop (HTTP), so a lagging loop
    # makes them late; False when they come from the server itself (the in-process engine).
    chunk_times_from_loop: bool

    async def open(self) -> None: ...

    def prepare(self, spec: RequestSpec) -> Any: ...

    async def send(
        self, spec: RequestSpec, prepared: Any, record: RequestRecord, timeout_s: float
    ) -> None: ...

    async def close(self) -> None: ...

    def worker_factory(self) -> Any | None:
        """A picklable zero-argument callable that builds an equivalent target in another
        process, or None when the target cannot leave this process."""
        ...
