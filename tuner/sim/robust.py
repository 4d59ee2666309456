"""Robustness in virtual time: a config's capacity when the traffic differs from the workload.

Production traffic drifts: more long prompts one hour, burstier arrivals the next. The band is
the long-prompt fraction from half to one and a half times the workload's, crossed with gamma
arrivals of shape 0.5 (bursty) to 2 (smooth); Poisson is shape 1. Each cell is a full capacity
search on the fitted simulator, so the band costs seconds, not hours. A cell's request list
keeps the workload's own short and long requests, drawn again (seeded) in the cell's
proportion, so lengths stay the workload's and only the mix moves.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from loadgen import RequestSpec
from tuner.measure.meter import Meter
from tuner.sim.screen import searches
from tuner.sim.target import SimTarget
from tuner.targets.knobs import Knobs, knobs_to_json

LONG_FACTORS = (0.5, 1.0, 1.5)  # the workload's long-prompt fraction times these
BURSTINESS = (0.5, 1.0, 2.0)  # gamma shape of the arrivals (1 = Poisson)
LONG = "long"


@dataclass(frozen=True, slots=True)
class Cell:
    long_factor: float
    long_fraction: float
    burstiness: float
    capacity_rps: float


def long_fraction(requests: list[RequestSpec]) -> float:
    return sum(r.class_name == LONG for r in requests) / max(1, len(requests))


def reshaped(requests: list[RequestSpec], factor: float, seed: int) -> list[RequestSpec]:
    """The request list with `factor` times its long-prompt fraction (capped at 1), the same
    length, drawn from its own short and long requests."""
    longs = [r for r in requests if r.class_name == LONG]
    shorts = [r for r in requests if r.class_name != LONG]
    if factor == 1.0 or not longs or not shorts:
        return list(requests)
    n = len(requests)
    n_long = min(n, round(len(longs) * factor))
    rng = random.Random(seed)
    # Long requests fall at random places, as in the workload itself.
    is_long = [True] * n_long + [False] * (n - n_long)
    rng.shuffle(is_long)
    picked = [rng.choice(longs) if want else rng.choice(shorts) for want in is_long]
    return [dataclasses.replace(r, index=i) for i, r in enumerate(picked)]


async def bands(sim: SimTarget, meter: Meter, configs: list[tuple[Knobs, float]],
                workers: int | None = None) -> list[list[Cell]]:  # fmt: skip
    """Each (config, start rate)'s simulated capacity in every cell of the band: one search a
    cell, all of them spread over the cores (`screen.searches`)."""
    base = list(meter.requests)
    fraction = long_fraction(base)
    cells, jobs = [], []
    for factor in LONG_FACTORS:
        requests = reshaped(base, factor, meter.settings.seed)
        for shape in BURSTINESS:
            level = dataclasses.replace(meter.settings, arrival="gamma", burstiness=shape)
            cell_meter = dataclasses.replace(meter, requests=requests, settings=level)
            cells.append((factor, min(1.0, fraction * factor), shape))
            jobs += [(cell_meter, knobs, start) for knobs, start in configs]
    found = await searches(sim, jobs, workers)
    per_cell = len(configs)
    return [[Cell(*cell, found[i * per_cell + c]) for i, cell in enumerate(cells)]
            for c in range(per_cell)]  # fmt: skip


def band_json(trial: int, knobs: Knobs, cells: list[Cell]) -> dict[str, Any]:
    worst = min(cells, key=lambda c: c.capacity_rps)
    return {
        "trial": trial, "config": knobs_to_json(knobs),
        "worst_rps": worst.capacity_rps,
        "worst_cell": {"long_fraction": worst.long_fraction, "burstiness": worst.burstiness},
        "cells": [dataclasses.asdict(c) for c in cells],
    }  # fmt: skip
