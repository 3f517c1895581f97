"""node: one per host. The node process, its worker processes (the handles it keeps, the worker
process itself, what every child does first), its config, its link to the master, where its
processes listen for other hosts (``reach``), what a dead node leaves behind, and its ports
(``ports``: the protocols its collaborators, the master link, supervision's node side and the
chaos relay, are typed with instead of ``Node``).

Imports core, wire, transports, security (the keys of the node and its children), logs,
metrics (its Prometheus endpoint, when configured); supervision (the node's side, the worker's
health, the policies its config holds), chaos (the worker's side) and tasks' getter (a worker
runs task actors). Nothing from pipeline or testing.
"""

__all__: list[str] = []
