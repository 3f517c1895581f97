"""commands: the ``troupe`` subcommands (node, master, ctl, chaos, logs, run).

Imports troupe's runtime and actors, and troupe.cli's shared modules (client, master_client,
local_node, tables, preflight, stop_signals).
"""

__all__: list[str] = []
