"""The library behind scripts/*.py: small modules, each with one job (README: Architecture)."""
