"""testing: the pytest plugin (``plugin``, the ``troupe_cluster`` fixture) and the running cluster
a test sees (``cluster``).

Imports core, transports and errors (and pipeline's runner, lazily, for ``Cluster.run_pipeline``), and
starts nodes as processes (``troupe node start``);
nothing of the runtime imports it.
"""

__all__: list[str] = []
