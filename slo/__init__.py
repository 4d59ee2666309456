"""slo package."""
