"""transports: how frames move between processes. ``base``: the transport interface and the
in-memory transport; ``zmq`` (with ``zmq_socket`` and ``zmq_outbox``): ZeroMQ.

Imports troupe.runtime.errors and core's mailbox and peer limits; nothing from node,
supervision, chaos, tasks, pipeline or testing.
"""

__all__: list[str] = []
