"""Verbs: what the scripts' subcommands do end to end (up, show, bench, kernel proof), over the layers."""
