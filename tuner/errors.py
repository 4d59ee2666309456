"""The one exception type for errors a user of the tuner can cause."""


class TuneError(ValueError):
    """Bad input, an unreachable target or an unusable study; the message names the fix."""
