"""The application layer: the search and profile jobs the CLI (and Python callers) run."""
