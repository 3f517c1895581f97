"""node: one per host. The node process, its worker processes (the handles it keeps, the worker
process itself, what every child does first), its config, its link to the master, and what a
dead node leaves behind.

Imports core, wire, transports, logs; supervision (the node's side, the worker's health, the
policies its config holds), chaos (the worker's side) and tasks' getter (a worker runs task
actors). Nothing from pipeline or testing.
"""

__all__: list[str] = []
