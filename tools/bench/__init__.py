"""bench: ``troupe bench`` (messaging, scale, recovery, pipeline) and the actors it runs.

Imports troupe's runtime and actors, and troupe.cli's shared modules.
"""

__all__: list[str] = []
