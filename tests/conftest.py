"""Suite-wide setup that must happen before any test module imports torch."""

import os

# Same reason as in engine_lite/__init__.py: idle-spinning OpenMP workers starve a 2-core runner.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
