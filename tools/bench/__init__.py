"""bench: ``troupe bench`` (messaging, scale, recovery, pipeline, train) and the actors it runs.

Imports troupe's runtime and actors, troupe.cli's shared modules, and ``commands.run_pipeline``
(the pipeline benchmark runs what ``troupe run`` runs).
"""

__all__: list[str] = []
