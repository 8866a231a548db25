"""The trial machinery: run one trial as a child process, watch it, decide how it ended."""
