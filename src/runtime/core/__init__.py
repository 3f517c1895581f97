"""core: actors, their cells, the runtime of one process (it hosts actors and routes what
arrives: ``runtime``, ``router``), refs and the directory, mailboxes, ask deadlines, loading
actor classes, control payloads, config messages, per-peer limits, and ``connect`` (``client``)
for programs that are not workers.

Imports troupe.runtime.errors, wire, security and transports (``runtime.process_runtime``, the
runtime a process starts for itself, builds on the ZeroMQ transport, with the process's keys);
nothing from node, supervision, chaos, tasks, pipeline or testing, except that ``loading``
names node's and pipeline's configs for type checking only.
"""

__all__: list[str] = []
