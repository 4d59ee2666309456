"""A level measured while another program takes the CPU is measured again: real processes,
the real /proc counters, and the meter's retry."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen import build_workload
from slo import parse_slo
from tuner.measure.contention import FOREIGN_CORES, MIN_WATCH_S, CpuGuard
from tuner.measure.meter import LevelSettings, Meter
from tuner.measure.verdict import VerdictRules
from tuner.store.codec import level_from_row, level_row
from tuner.targets.base import TargetKind

pytestmark = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux /proc")
SPIN = [sys.executable, "-c", "while True: pass"]
SLO = parse_slo("tpot_p99=30ms")


def start_foreign_spinner() -> int:
    """A busy process outside this test's process tree: the shell that starts it exits at once,
    so it is re-parented away from us, as another user's program would be."""
    script = f"{shlex.join(SPIN)} >/dev/null 2>&1 & echo $!"
    line = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    return int(line.strip())


def stop(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def watch(guard: CpuGuard, seconds: float):
    mark = guard.mark()
    time.sleep(seconds)
    return guard.since(mark)


def test_another_programs_cpu_counts_as_foreign_and_our_own_childrens_does_not():
    guard = CpuGuard()
    child = subprocess.Popen(SPIN)
    try:
        ours = watch(guard, 1.5)
    finally:
        child.kill()
        child.wait()
    assert ours is not None and not ours.contended, ours
    pid = start_foreign_spinner()
    try:
        theirs = watch(guard, 1.5)
    finally:
        stop(pid)
    assert theirs is not None and theirs.contended and theirs.foreign_cores > 0.6, theirs
    assert "other processes used" in theirs.describe()


def test_an_interval_too_short_to_tell_is_not_judged():
    guard = CpuGuard()
    assert guard.since(guard.mark()) is None
    assert MIN_WATCH_S >= 1.0  # one tick of another process in 10 ms must not read as a core


def test_a_guard_is_kept_only_for_targets_whose_work_runs_in_this_run():
    assert CpuGuard.for_target(TargetKind.BUILTIN) is not None
    assert CpuGuard.for_target(TargetKind.VLLM) is not None
    assert CpuGuard.for_target(TargetKind.URL) is None  # the server may be anywhere
    assert CpuGuard.for_target(TargetKind.SYNTHETIC) is None


class SlowReplay:
    """The simulated target, taking 1.2 s of real time per level, with a hook after each."""

    def __init__(self, inner, after) -> None:
        self.inner, self.after, self.facts, self.knobs = inner, after, inner.facts, inner.knobs
        self.replays = 0

    async def apply(self, knobs) -> None:
        await self.inner.apply(knobs)

    async def replay(self, requests, offsets, plan):
        await asyncio.sleep(MIN_WATCH_S + 0.2)
        out = await self.inner.replay(requests, offsets, plan)
        self.replays += 1
        self.after(self.replays)
        return out


def slow_meter(target) -> Meter:
    requests = build_workload("mixed", num_requests=40, seed=0, vocab_size=4096).requests
    return Meter(target, requests, SLO, LevelSettings(duration_s=2.0, min_requests=10),
                 VerdictRules(require_schedule=False), guard=CpuGuard())  # fmt: skip


async def test_a_level_slowed_by_another_program_is_measured_again_on_a_quiet_machine(
    sim_target,
):
    pid = start_foreign_spinner()
    spinner = [pid]

    def stop_after_first(n: int) -> None:
        if n == 1:
            stop(spinner.pop())

    try:
        target = SlowReplay(sim_target, stop_after_first)
        await target.apply({})
        run = await slow_meter(target).level(4.0)
    finally:
        stop(spinner[0] if spinner else None)
    assert target.replays == 2  # the contended try did not count
    assert run.level.tries == 2
    assert run.level.foreign_cpu_cores is not None
    assert run.level.foreign_cpu_cores <= FOREIGN_CORES
    kept = level_from_row(level_row(run.level), SLO, VerdictRules(require_schedule=False))
    assert (kept.tries, kept.foreign_cpu_cores) == (2, run.level.foreign_cpu_cores)


async def test_a_quiet_level_is_measured_once(sim_target):
    target = SlowReplay(sim_target, lambda n: None)
    await target.apply({})
    run = await slow_meter(target).level(4.0)
    assert target.replays == 1 and run.level.tries == 1


async def test_a_retry_waits_for_another_programs_work_to_end():
    guard = CpuGuard(settle_max_s=20.0)
    pid = start_foreign_spinner()
    # The other program runs for 3 s more: the guard waits it out, then goes on at once.
    killer = asyncio.get_running_loop().call_later(3.0, stop, pid)
    try:
        settled = await guard.settle()
    finally:
        killer.cancel()
        stop(pid)
    assert settled.quiet and 3.0 <= settled.waited_s < 20.0, settled


async def test_a_machine_that_stays_busy_is_waited_on_no_longer_than_the_limit():
    guard = CpuGuard(settle_max_s=3.0)
    pid = start_foreign_spinner()
    try:
        settled = await guard.settle()
    finally:
        stop(pid)
    assert not settled.quiet and settled.waited_s >= 3.0


async def test_a_level_whose_machine_stayed_busy_through_the_wait_is_not_tried_again(
    sim_target,
):
    pid = start_foreign_spinner()  # busy through every try and every wait
    try:
        target = SlowReplay(sim_target, lambda n: None)
        await target.apply({})
        meter = slow_meter(target)
        meter.guard = CpuGuard(settle_max_s=2.0)
        run = await meter.level(4.0)
    finally:
        stop(pid)
    # No quiet window in the whole wait: another try would land in the same stretch, so the
    # one try is kept, with what others used during it.
    assert target.replays == 1 and run.level.tries == 1
    assert run.level.foreign_cpu_cores > FOREIGN_CORES
