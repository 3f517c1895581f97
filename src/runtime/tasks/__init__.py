"""tasks: task dispatch. Task state and the task book (pure) with its tables, rows and
placement, speculation, the journal, job specs, the worker's task getter and task actors,
exactly-once output commits and the content store; ``master`` is the control plane built on
them.

Imports core, wire, transports and (the master only) node's config and metrics (its Prometheus
endpoint); nothing from supervision, chaos, pipeline or testing.
"""

__all__: list[str] = []
