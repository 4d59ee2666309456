"""Progress of a replay (requests sent / finished) as a rich progress bar on stderr."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Protocol

REFRESH_S = 0.25  # redraws are cheap at this pace and never compete with chunk parsing


class CounterView(Protocol):
    @property
    def sent(self) -> int: ...

    @property
    def done(self) -> int: ...


class MutableCounters(Protocol):
    """Where a running schedule counts its requests."""

    sent: int
    done: int


class Counters:
    """Requests dispatched and finished so far in this process."""

    __slots__ = ("done", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.done = 0


@contextlib.contextmanager
def progress_display(enabled: bool, total: int, counters: CounterView) -> Iterator[None]:
    """Show two bars while the body runs (inside a running event loop); no-op if disabled."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        auto_refresh=False,
        transient=True,
    )
    sent = bar.add_task("sent", total=total)
    done = bar.add_task("finished", total=total)

    def redraw() -> None:
        bar.update(sent, completed=counters.sent)
        bar.update(done, completed=counters.done)
        bar.refresh()

    async def refresh() -> None:
        while True:
            redraw()
            await asyncio.sleep(REFRESH_S)

    with bar:
        task = asyncio.get_running_loop().create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            redraw()
