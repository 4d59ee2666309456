"""The vLLM default measured at the recommended config's rate: does the SLO actually bind?

"1.1x the default's capacity" is a ratio of two rate searches. The plainer question a serving
engineer asks is: at the traffic the recommendation is rated for, would the default have met the
SLO? One more level of the same seeded request list, on the default config, at the recommended
config's confirmed rate, answers it side by side with the recommendation's own figures there.
"""

from __future__ import annotations

from tuner.measure.judge import judge_runs
from tuner.measure.meter import Meter
from tuner.store.records import Candidate, Mode, SameRateCheck, TrialRecord
from tuner.store.runfiles import SAME_RATE_RECORDS, RunFiles


def worth_checking(
    mode: Mode, chosen: Candidate | None, default: TrialRecord | None, repeats: int
) -> bool:
    """Only in capacity mode, for a confirmed recommendation that is not the default itself,
    and not with --repeats 0 (which asks for no re-measurement at all)."""
    if mode is not Mode.CAPACITY or chosen is None or not chosen.clears or repeats == 0:
        return False
    return default is not None and default.knobs != chosen.knobs


async def default_at_rate(
    meter: Meter, files: RunFiles, default_knobs: dict, chosen: Candidate, seed: int = 0
) -> SameRateCheck:
    """Measure the default once at the recommendation's confirmed rate."""
    rate = chosen.verdict.rate_rps
    await meter.target.apply(default_knobs)
    run = await meter.level(rate)
    files.write_records(files.root / SAME_RATE_RECORDS, run.records)
    default = judge_runs([run.run()], meter.slo, meter.rules, rate, seed)
    return SameRateCheck(rate, default, chosen.verdict, chosen.repeats)
