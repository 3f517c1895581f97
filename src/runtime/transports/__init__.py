"""transports: how frames move between processes. ``base``: the transport interface and the
in-memory transport; ``zmq``: ZeroMQ (its parts ``zmq_receiving``, ``zmq_sending``,
``zmq_replies`` and ``zmq_connections``; below them ``zmq_socket``, ``zmq_outbox``,
``zmq_peer_loss`` and ``zmq_handshakes``).

Imports troupe.runtime.errors, security (CURVE keys and the authenticator) and core's mailbox
and peer limits; nothing from node, supervision, chaos, tasks, pipeline or testing.
"""

__all__: list[str] = []
