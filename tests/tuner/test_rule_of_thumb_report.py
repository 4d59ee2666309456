"""A rule of thumb the run did not measure is reported as not measured, never with the
default's figure: screened reports once read "the rule of thumb (4096-8192 for chat) serves
7.05 req/s (the same as vLLM's default here)" beside a budget of 2048."""

import pytest

from tuner.report.render import render_markdown

DEFAULT = {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
THUMB = {"max_num_batched_tokens": 4096, "max_num_seqs": 128}


def entry(config, rps, role):
    return {"trial": 0, "role": role, "config": config, "capacity_rps": rps, "terms": [],
            "limited_by": "tpot_p99 40 ms over its limit at 9.00 req/s"}  # fmt: skip


def report(thumb, ratio=None):
    rec = {"slo": "tpot_p99=30ms", "summary": "s", "feasible": True,
           "best": entry({**DEFAULT, "max_num_batched_tokens": 432}, 9.5, "screened"),
           "default": entry(DEFAULT, 8.0, "default"), "rule_of_thumb": thumb,
           "ratio_vs_rule_of_thumb": ratio, "objective": {"mode": "capacity", "definition": "d"},
           "trials": [], "top": []}  # fmt: skip
    return render_markdown(rec, {})


@pytest.mark.parametrize("simulated", [11.2, None])
def test_an_unmeasured_rule_of_thumb_is_said_to_be_so_with_its_simulated_figure(simulated):
    md = report({"table": "4096-8192 for chat", "scenario": "chat", "config": THUMB,
                 "measured": False, "capacity_rps": None, "simulated_rps": simulated})  # fmt: skip
    assert "was not measured in this run" in md
    assert "the same as vLLM's default" not in md and "serves 8.00" not in md
    row = next(line for line in md.splitlines() if line.startswith("| rule of thumb"))
    assert "budget=4096" in row and "not measured" in row and "8.00" not in row
    assert ("simulated at 11.20 req/s" in md) == (simulated is not None)
    # What stops the recommendation is still said.
    assert "What stops the recommended config going faster: tpot_p99 40 ms" in md


def test_a_rule_of_thumb_that_is_the_default_reads_the_defaults_measured_figure():
    thumb = {**entry(DEFAULT, 8.0, "default"), "table": "2048 for code completion",
             "scenario": "code", "measured": True, "same_as_default": True}  # fmt: skip
    md = report(thumb, 9.5 / 8.0)
    assert (
        "serves 8.00 req/s (the same as vLLM's default here); the measured config serves "
        "1.19x that." in md
    )
    assert "not measured" not in md
