"""The study loop and what defines a study: space, fixed arguments, hardware, recommendation."""
