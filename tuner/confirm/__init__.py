"""After the search: re-measure the top configs, and the default at the recommended rate."""
