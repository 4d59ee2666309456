"""Was the machine ours during a level? CPU used outside this run's processes, and stolen.

On a shared 2-core machine another program (a build, a test run, a second `tune`) takes CPU
from the engine mid-level. Measured here: a level of the 4096-token budget, run while a package
installed beside it, read its decode steps 1.95x slower than the cost model fitted minutes
before, and its TPOT p99 at 46 ms; the same config at the same rate with the machine to itself
gave 21-24 ms, as the model did. A rate search that fails such a level puts the config's
capacity below its own, and that is the machine failing, not the config.

So a level is judged only on a machine that was the run's: processes outside this run's tree
(this process and its descendants: the engine, the client process, a server `tune` started)
used at most `FOREIGN_CORES`, and the hypervisor stole at most `STEAL_SHARE` of the CPU. A
level that fails that is measured again (`Meter.level`). Linux only (`/proc`); elsewhere no
guard is kept and levels are judged as they come.

What `/proc` cannot see (a neighbour VM on the same host, with no steal reported) slows the
built-in engine's steps too; for that target the guard also reads their pace (`pace.py`).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.measure.pace import SLOW_PACE, StepPace
from tuner.targets.base import TargetKind

FOREIGN_CORES = 0.25  # mean cores others may use during a level
STEAL_SHARE = 0.10  # of all CPU time, taken by the hypervisor
# Shorter intervals are not judged: at 100 ticks a second, one tick of another process in
# 10 ms would read as a whole core. (A simulated level in virtual time takes milliseconds.)
MIN_WATCH_S = 1.0
# Targets whose work runs in this run's processes: anything else using the CPU is not theirs.
# (A server at --url may run elsewhere, or beside us in processes we cannot tell from others.)
WATCHED = (TargetKind.BUILTIN, TargetKind.VLLM, TargetKind.LAUNCH)
# Before a level is measured again, the guard waits (in windows this long, at most
# `SETTLE_MAX_S`) for a window in which others used and stole no more than a level may: a try
# started straight after one that others' work slowed mostly lands in the same work.
SETTLE_WINDOW_S = 1.5
SETTLE_MAX_S = 15.0
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class CpuMark:
    """Counters at one instant, in clock ticks."""

    busy: int  # user + nice + system, every process on the machine
    steal: int
    ours: int  # this run's processes, with their reaped children
    at_s: float  # time.monotonic()


@dataclass(frozen=True, slots=True)
class CpuShare:
    """How much of the machine others had over one interval."""

    foreign_cores: float  # mean cores used by processes outside this run
    steal_share: float  # share of all CPU time stolen by the hypervisor
    # The built-in engine's steps against this run's usual pace (None: not read, or too few).
    step_pace: float | None = None

    @property
    def slow_steps(self) -> bool:
        return self.step_pace is not None and self.step_pace > SLOW_PACE

    @property
    def excess(self) -> float:
        """The worst of the three over its limit: above 1 the level was not the run's."""
        pace = (self.step_pace or 0.0) / SLOW_PACE
        return max(self.foreign_cores / FOREIGN_CORES, self.steal_share / STEAL_SHARE, pace)

    @property
    def contended(self) -> bool:
        return self.excess > 1.0

    def describe(self) -> str:
        parts = [f"other processes used {self.foreign_cores:.2f} cores"]
        if self.steal_share > STEAL_SHARE:
            parts.append(f"the hypervisor stole {self.steal_share:.0%} of the CPU")
        if self.slow_steps:
            parts.append(f"the engine's steps ran {self.step_pace:.2f}x its usual time")
        return " and ".join(parts)


@dataclass(frozen=True, slots=True)
class Settled:
    """How a wait for a quiet machine ended: after how long, and whether it found one."""

    waited_s: float
    quiet: bool


class CpuGuard:
    """Marks the CPU counters before a level and reads what others used since."""

    def __init__(self, root_pid: int | None = None, pace: StepPace | None = None,
                 settle_max_s: float = SETTLE_MAX_S) -> None:  # fmt: skip
        self.root = root_pid or os.getpid()
        self.settle_max_s = settle_max_s
        self.tick_hz = os.sysconf("SC_CLK_TCK")
        self.cores = os.cpu_count() or 1
        self.pace = pace
        # Told when a level starts and when the meter rejects it (`follow`).
        self._followers: list[Any] = []

    @classmethod
    def for_target(cls, kind: TargetKind, engine: object = None) -> CpuGuard | None:
        """A guard for a target whose work runs in this run's processes, on Linux; with the
        pace of its steps when it is an engine in this process that reports them."""
        if kind not in WATCHED or not (_PROC / "stat").is_file():
            return None
        steps = engine is not None and hasattr(engine, "add_step_listener")
        return cls(pace=StepPace(engine) if steps else None)

    @classmethod
    def watching(cls, target: Any) -> CpuGuard | None:
        """`for_target` for a target: its kind, and its engine when it runs in this process."""
        return cls.for_target(target.facts.kind, getattr(target, "engine", None))

    def follow(self, follower: Any) -> None:
        """`follower.level_started()` at each mark, `follower.level_rejected()` when the meter
        measures that level again: a simulator's step log drops the steps of a level the
        machine slowed, so they do not teach it a slower engine."""
        self._followers.append(follower)

    def mark(self) -> CpuMark:
        if self.pace is not None:
            self.pace.start()
        for f in self._followers:
            f.level_started()
        return self._counters()

    def reject(self) -> None:
        for f in self._followers:
            f.level_rejected()

    async def settle(self, window_s: float = SETTLE_WINDOW_S) -> Settled:
        """Wait until a window shows the machine quiet (others and the hypervisor within a
        level's limits), or `settle_max_s` passed. A level slowed only in its steps' pace
        (what `/proc` does not see) finds the first window quiet."""
        started = time.monotonic()
        while time.monotonic() - started < self.settle_max_s:
            before = self._counters()
            await asyncio.sleep(window_s)
            share = self._share(before, self._counters(), None)
            if share is not None and not share.contended:
                return Settled(time.monotonic() - started, quiet=True)
        return Settled(time.monotonic() - started, quiet=False)

    def _counters(self) -> CpuMark:
        busy, steal = _machine_ticks()
        return CpuMark(busy, steal, _tree_ticks(self.root), time.monotonic())

    def since(self, before: CpuMark) -> CpuShare | None:
        """What others had since `before`; None for an interval too short to tell."""
        after = self._counters()
        pace = self.pace.stop() if self.pace is not None else None
        return self._share(before, after, pace)

    def _share(self, before: CpuMark, after: CpuMark, pace: float | None) -> CpuShare | None:
        wall_s = after.at_s - before.at_s
        if wall_s < MIN_WATCH_S:
            return None
        ticks = wall_s * self.tick_hz
        # Ticks are sampled, so a short quiet interval can read slightly below zero.
        foreign = max(0, (after.busy - before.busy) - (after.ours - before.ours)) / ticks
        steal = max(0, after.steal - before.steal) / (ticks * self.cores)
        return CpuShare(foreign, steal, pace)


def others_mark() -> CpuMark | None:
    """Counters for `others_cores`, with `ours` this process's own (every thread, no children).
    None off Linux."""
    if not (_PROC / "stat").is_file():
        return None
    rest = (_PROC / "self" / "stat").read_text().rsplit(")", 1)[1].split()
    busy, steal = _machine_ticks()
    return CpuMark(busy, steal, sum(int(x) for x in rest[11:13]), time.monotonic())


def others_cores(before: CpuMark | None) -> float | None:
    """Mean cores every other process used since `others_mark()`, this run's own children
    included: a measurement timed inside this process wants the machine to itself."""
    after = others_mark()
    if before is None or after is None or after.at_s <= before.at_s:
        return None
    ticks = (after.at_s - before.at_s) * os.sysconf("SC_CLK_TCK")
    return max(0, (after.busy - before.busy) - (after.ours - before.ours)) / ticks


def _machine_ticks() -> tuple[int, int]:
    # cpu user nice system idle iowait irq softirq steal ...: irq and softirq are left out,
    # since loopback traffic to our own server is handled there and belongs to no process.
    fields = (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system = (int(x) for x in fields[:3])
    steal = int(fields[7]) if len(fields) > 7 else 0
    return user + nice + system, steal


def _tree_ticks(root: int) -> int:
    """CPU ticks of `root` and its live descendants, each with the children it reaped."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited while we looked
            continue
        # Fields after "(comm)": state ppid ... utime(11) stime(12) cutime(13) cstime(14).
        rest = stat[stat.rfind(")") + 2 :].split()
        pid = int(entry.name)
        parent[pid] = int(rest[1])
        ticks[pid] = sum(int(x) for x in rest[11:15])
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total
