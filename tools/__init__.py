"""cli: the ``troupe`` command (``main``), its subcommands (``commands``), the benchmarks
(``bench``), and what they share: talking to nodes (``client``) and to the master
(``master_client``; ``endpoint_probe`` the look at an endpoint first, ``master_tables`` the
status tables), a node run in the command's own process (``local_node``), tables, checks
made before anything starts (``preflight``) and stop signals (``stop_signals``).

Imports troupe.runtime and troupe.actors; nothing of troupe imports it (the test cluster starts
its nodes as processes, ``troupe node start``).
"""
