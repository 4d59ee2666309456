"""The one exception type for errors a user of loadgen can cause."""


class LoadgenError(ValueError):
    """Bad input, configuration or target; the message names the bad value and the fix."""
