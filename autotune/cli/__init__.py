"""The command line: one small module per command, one console, the live view of a study."""
