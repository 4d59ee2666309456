"""What a run shows: the live display, and the recommendation as JSON, Markdown and HTML."""
