"""What a run keeps: typed trial records, their Optuna attributes, and the run folder."""
