"""commands: the ``troupe`` subcommands (node, master, ctl, chaos, logs, run).

Imports troupe's runtime and actors, and troupe.cli's client, tables, preflight and signals.
"""

__all__: list[str] = []
