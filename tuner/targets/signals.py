"""Run a measurement so that SIGTERM and SIGHUP end it the way Ctrl-C does.

Python's default for either signal ends the process on the spot: no `finally` runs, so a
server started with `--launch` (in its own process group, so the terminal's signals miss it)
outlives the run and keeps its port. Here both cancel the running task instead, which unwinds
through every `finally`: the trial is marked and queued again, the server's group is stopped.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
# The signals a service manager, a closing terminal or `kill` send to end a process politely.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """The run was asked to stop by a signal. A BaseException like KeyboardInterrupt, so no
    `except Exception` on the way out mistakes it for a failed trial."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for "ended by signal N"


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, with SIGTERM and SIGHUP raising `Stopped` after `main` has
    unwound (SIGINT still raises KeyboardInterrupt, as asyncio.run makes it)."""
    return asyncio.run(_stoppable(main))


async def _stoppable(main: Coroutine[Any, Any, T]) -> T:
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def stop(signum: int) -> None:
        if not received:  # a second signal must not cut short the cleanup of the first
            received.append(signum)
            task.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await main
    except asyncio.CancelledError:
        if not received:
            raise
        task.uncancel()
        raise Stopped(received[0]) from None
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
