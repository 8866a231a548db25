"""Search-space YAML files shipped with autotune, one per backend (package data)."""
