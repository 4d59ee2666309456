"""What a trial measures: the built-in engine, a launched server, a URL; the knobs each takes."""
