"""tuner package."""
