"""chaos: fault injection. The faults themselves, the node's relay of ``chaos`` and ``heal``, and
the worker's side of them.

Imports core and node (worker handles; the ``NodeView`` port, for type checking); the relay
names what it needs of supervision as a protocol of its own (``KillNotes``). ``faults`` imports
errors and core's cell (the ``DROP`` verdict), nothing else. Nothing from tasks, pipeline or
testing.
"""

__all__: list[str] = []
