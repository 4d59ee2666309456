"""Measuring one config: a load level, its verdict against the SLO, its capacity."""
