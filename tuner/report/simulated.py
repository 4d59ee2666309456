"""The report's tables of what the simulator said: simulated against measured for every
verified config, and the top configs across the traffic band."""

from __future__ import annotations

from typing import Any

from tuner.report.summary import short_config


def sim_table(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Each verified config: simulated and measured capacity, and the two errors."""
    sim = rec.get("sim")
    if not sim or not sim.get("verified"):
        return None
    head = ["config", "simulated", "measured", "capacity error", "default simulated",
            "gain overstated by"]  # fmt: skip

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    rows = []
    for v in sim["verified"]:
        measured = v.get("measured_rps")
        default = v.get("simulated_default_rps")
        rows.append([short_config(v["config"]), f"{v['simulated_rps']:.2f}",
                     f"{measured:.2f}" if measured else "pruned", pct(v["capacity_err"]),
                     f"{default:.2f}" if default else "-", pct(v.get("gain_err"))])  # fmt: skip
    return head, rows


def sim_note(rec: dict[str, Any]) -> str:
    sim = rec["sim"]
    bound = f"{sim['error_bound']:.0%}"
    verdict = (
        f"it overstated the gain of every config it chose by more than {bound}, so the rest "
        "of the budget searched on the target itself"
        if sim["fell_back"]
        else f"at least one config it chose held its gain within {bound}, so the search kept "
        "to the screened configs"
    )
    return (
        f"{sim['configs_screened']} configs screened in virtual time, in {sim['screen_s']:.0f} s "
        f"({sim['model_source']}); each verified config's prediction as it was queued. A "
        "pruned config's errors are reckoned from its lowest failing rate, which its capacity "
        "lies below; a gain is overstated only past the most its measurement allows (up to "
        "the config's first failing rate, over the default's capacity). The gain over the "
        "default decides the fall-back, not the capacity (the search falls back when no "
        "verified config held its gain): a "
        "model errs for a config and the default alike, while a shared machine's speed drifts "
        f"between measurements minutes apart. Here {verdict}."
        + (f" Verification ended because {sim['verification_ended']}."
           if sim.get("verification_ended") else "")
    )  # fmt: skip


def band_table(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Each banded config's capacity per cell (rows: configs; columns: long x burstiness)."""
    band = rec.get("robustness")
    if not band or not band.get("configs"):
        return None
    cells = band["configs"][0]["cells"]
    head = ["trial", "worst req/s"] + [
        f"long x{c['long_factor']:g}, burst {c['burstiness']:g}" for c in cells
    ]
    rows = [[str(c["trial"] + 1), f"{c['worst_rps']:.2f}",
             *(f"{x['capacity_rps']:.2f}" for x in c["cells"])]
            for c in band["configs"]]  # fmt: skip
    return head, rows


def band_note(rec: dict[str, Any]) -> str:
    band = rec["robustness"]
    trust = (
        ""
        if band["trusted"]
        else (
            " The simulator overstated a verified config's gain over the default by more than "
            "its bound in this run: read these as indicative."
        )
    )
    return (f"Capacity in virtual time with the workload's long-prompt fraction "
            f"({band['long_fraction']:.0%}) scaled x0.5-1.5 and gamma arrivals of shape 0.5 "
            f"(bursty) to 2 (smooth); {band['basis']}. Recommended by "
            f"{band['chosen_by']}.{trust}")  # fmt: skip
