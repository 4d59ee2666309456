"""Serving in virtual time: a target on engine_lite's real scheduler and a fitted cost model,
its calibration on the real target, and screening many configs before the real target
measures the best."""
