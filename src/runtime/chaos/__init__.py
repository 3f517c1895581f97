"""chaos: fault injection. The faults themselves, the node's relay of ``chaos`` and ``heal``, and
the worker's side of them.

Imports core, node (worker handles) and, for type checking, supervision; ``faults`` imports
only errors. Nothing from tasks, pipeline or testing.
"""

__all__: list[str] = []
