"""The one exception type for errors a user of engine_lite can cause."""


class EngineLiteError(ValueError):
    """Bad input or configuration; the message names the bad value and the fix."""
