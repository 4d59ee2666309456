"""engine_lite package."""
