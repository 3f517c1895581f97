"""supervision: the supervisor process that kills hung workers, the node's side of it (restarts),
heartbeats, liveness (pure), restart policy (pure), the worker's status record and health.

Imports core, wire, transports, security (the keys; the heartbeats' MAC), logs, node (config,
child helpers, worker handles; the ``SupervisedNode`` port, the few calls the node's side uses
of the node) and chaos
(the node's side installs the chaos relay); ``liveness``, ``restart`` and ``status`` import
only errors. Nothing from tasks, pipeline or testing.
"""

__all__: list[str] = []
