"""The Optuna search: the knob space, the study, one trial, and the loop that runs trials."""
