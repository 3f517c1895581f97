"""transports: how frames move between processes. ``base``: the transport interface and the
in-memory transport; ``zmq`` (with ``zmq_socket``, ``zmq_outbox`` and ``zmq_handshakes``):
ZeroMQ.

Imports troupe.runtime.errors, security (CURVE keys and the authenticator) and core's mailbox
and peer limits; nothing from node, supervision, chaos, tasks, pipeline or testing.
"""

__all__: list[str] = []
