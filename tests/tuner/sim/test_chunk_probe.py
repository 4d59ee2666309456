"""The chunk probe is read on a quiet machine: a busy process beside it (this test's own child,
as a run's client process would be) makes it probe again, on the real tiny engine."""

import subprocess
import sys
from pathlib import Path

import pytest

from engine_lite import AsyncEngine, EngineConfig
from tuner.measure.contention import FOREIGN_CORES
from tuner.sim.chunk_probe import described, probe_alone

pytestmark = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux /proc")
_TINY = {"device": "cpu", "max_model_len": 1024, "max_num_batched_tokens": 256}


def spinner(seconds: float) -> subprocess.Popen:
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return subprocess.Popen([sys.executable, "-c", code])


class Counted:
    """The engine, counting the probes it ran."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine, self.runs = engine, 0

    async def while_idle(self, fn):
        self.runs += 1
        return await self.engine.while_idle(fn)


async def probe_beside_a_spinner(engine, seconds: float, **kwargs):
    """The guarded probe while a child process spins for `seconds`; (tries, probe)."""
    counted, busy = Counted(engine), spinner(seconds)
    try:
        probe = await probe_alone(counted, **kwargs)
    finally:
        busy.kill()
        busy.wait()
    return counted.runs, probe


@pytest.fixture
async def engine():
    engine = AsyncEngine(EngineConfig(num_gpu_blocks_override=1024, **_TINY))
    await engine.start()
    yield engine
    await engine.shutdown()


async def test_a_quiet_machine_is_probed_once(engine):
    counted = Counted(engine)
    probe = await probe_alone(counted)
    assert counted.runs == 1
    assert probe is not None and probe.others_cores is not None
    assert probe.others_cores <= FOREIGN_CORES
    assert "other processes" not in described(probe)


async def test_a_probe_beside_a_busy_process_is_taken_again_once_it_ends(engine):
    # Busy through the first try, gone before the second.
    runs, probe = await probe_beside_a_spinner(engine, 1.5, tries=3, pause_s=2.0)
    assert runs == 2
    assert probe is not None and probe.others_cores is not None
    assert probe.others_cores <= FOREIGN_CORES


async def test_a_machine_busy_throughout_keeps_the_quietest_try_and_says_so(engine):
    runs, probe = await probe_beside_a_spinner(engine, 60, tries=2, pause_s=0.1)
    assert runs == 2
    assert probe is not None and probe.others_cores > 0.5
    assert f"while other processes used {probe.others_cores:.2f} cores" in described(probe)
    assert probe.to_json()["others_cores"] == probe.others_cores
