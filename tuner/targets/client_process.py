"""The load loop for HTTP targets, in a process of its own that nothing else can block.

A level's latencies are the client's chunk arrival times, stamped by its event loop; anything
else running in that loop (or holding the GIL of that process: Optuna, reports, a live
display, a scrape of the server's metrics) delays the stamps and the sends. So every HTTP level
is replayed by one long-lived child (`python -m tuner.targets.client_process`) that only sends
requests and reads streams, with a raised CPU priority when the system allows it. Requests go
over the pipe once; each level then names how many of them to send and when.

Wire format: length-prefixed pickles, both ways, between this process and its own child.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadgen import LoadgenError, ReplayResult, RequestSpec
from loadgen.stop import StopRule
from tuner.errors import TuneError

_HEADER = struct.Struct("!Q")
# Niceness the client asks for: enough that a busy server and the tuner cannot starve its
# wake-ups on a small machine, while it uses a few percent of one core.
CLIENT_NICENESS = -5


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One level: the first `count` requests at `offsets`, against one server."""

    url: str
    model: str
    endpoint: str
    count: int
    offsets: list[float]
    warmup: int
    timeout_s: float
    lag_tolerance_s: float
    stop: StopRule | None = None  # pickled with the job: the rule runs beside the load loop


class ClientProcess:
    """The parent's handle on the child; `replay()` awaits a level without blocking."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._sent: Sequence[RequestSpec] | None = None

    async def replay(self, requests: Sequence[RequestSpec], job: ReplayJob) -> ReplayResult:
        proc = await self._ensure_started()
        if self._sent is not requests:
            await self._call(proc, ("requests", list(requests)))
            self._sent = requests
        return await self._call(proc, ("replay", job))

    async def close(self) -> None:
        proc, self._proc, self._sent = self._proc, None, None
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    def _abandon(self, proc: asyncio.subprocess.Process) -> None:
        self._proc, self._sent = None, None
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tuner.targets.client_process",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            self._sent = None
        return self._proc

    async def _call(self, proc: asyncio.subprocess.Process, message: Any) -> Any:
        assert proc.stdin is not None and proc.stdout is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        proc.stdin.write(_HEADER.pack(len(data)) + data)
        await proc.stdin.drain()
        try:
            size = _HEADER.unpack(await proc.stdout.readexactly(_HEADER.size))[0]
            kind, value = pickle.loads(await proc.stdout.readexactly(size))
        except asyncio.IncompleteReadError:
            self._proc = None
            raise TuneError(
                "the load generator's process died during a level; rerun with --resume"
            ) from None
        except BaseException:
            # Interrupted mid-call (Ctrl-C, a stop signal, a cancelled level): the child is busy
            # with a reply nobody will read, and would read the pipe's end only once its level
            # is over (a hung server's requests can take minutes). Killed, not waited for.
            self._abandon(proc)
            raise
        if kind == "lost":
            raise LoadgenError(value)
        if kind == "error":
            raise TuneError(value)
        return value


# ---- the child -----------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: the child is killed when its parent dies. It holds the parent's stderr, so a child
    outliving a parent killed by SIGKILL would keep that pipe open (whatever reads it to its end
    waits with it) and go on sending a level's requests."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _raise_priority() -> None:
    # An unprivileged user keeps the default; the lag check still guards every level.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, CLIENT_NICENESS)


def _read(stream: Any) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    return pickle.loads(stream.read(_HEADER.unpack(header)[0]))


def _write(stream: Any, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _run_job(requests: list[RequestSpec], job: ReplayJob) -> ReplayResult:
    from loadgen import HttpTarget, replay

    target = HttpTarget(job.url, job.model, endpoint=job.endpoint)
    return asyncio.run(replay(target, requests[: job.count], job.offsets, warmup=job.warmup,
                              timeout_s=job.timeout_s, progress=False,
                              lag_tolerance_s=job.lag_tolerance_s, stop=job.stop))  # fmt: skip


def main() -> None:
    _die_with_parent()
    _raise_priority()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies may reach the pipe
    requests: list[RequestSpec] = []
    while (message := _read(stdin)) is not None:
        kind, value = message
        if kind == "requests":
            requests = value
            _write(stdout, ("ok", None))
            continue
        try:
            _write(stdout, ("ok", _run_job(requests, value)))
        except LoadgenError as exc:  # the server did not answer: the parent names it lost
            _write(stdout, ("lost", str(exc)))
        except Exception as exc:  # reported to the parent as one line, not a dead pipe
            _write(stdout, ("error", f"the load generator failed: {type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    main()
