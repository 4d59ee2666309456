"""Watches the client's own event loop: how late do its timers fire?"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np


class LoopLagMonitor:
    """Samples timer lateness every `interval_s` while running.

    A loop busy parsing chunks (or stalled by the GIL, or starved of CPU) fires timers late;
    then send times slip and chunk arrival stamps are taken late, so measured latencies
    cannot be trusted. The selector rounds timeouts up to whole milliseconds, so an idle
    loop already shows up to ~1 ms.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.samples_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.samples_s.append(max(0.0, time.monotonic() - due))

    @property
    def max_s(self) -> float:
        return max(self.samples_s, default=0.0)

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.samples_s, 99)) if self.samples_s else 0.0
