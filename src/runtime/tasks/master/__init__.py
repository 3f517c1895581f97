"""master: the cluster's control plane for tasks. The master process, its driver (events into
the task book, records into the journal), what it knows of nodes, its operator side, and its
control payloads decoded into typed messages at the boundary (``controls``). It takes its clocks
(monotonic and wall) as arguments, so tests drive time.

Imports core, wire, transports, security (the keys), node's config (the bind check) and reach
(where its own log stream binds), log_publisher (that stream) and tasks; nothing from
supervision, chaos, pipeline or testing.
"""

__all__: list[str] = []
