"""metrics: the Prometheus endpoints of the node and of the master (prometheus-client). The
collectors (``node_metrics``, ``master_metrics``, ``pipeline_metrics``) read the live state of
the process on each scrape, through the protocols of ``ports``; ``server`` answers ``GET
/metrics`` on the event loop; ``address`` parses the ``HOST:PORT`` option; ``endpoints`` puts
a process's collectors in a private registry behind a server. docs/METRICS.md lists every
metric.

Imports troupe.runtime.errors and security's process (``security_metrics``: CURVE on, peers
refused); node and tasks are named for type checking only. Nothing from core, wire, transports,
node, supervision, chaos, tasks, pipeline or testing.
"""

__all__: list[str] = []
