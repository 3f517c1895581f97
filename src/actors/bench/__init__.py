"""bench: actors the shipped benchmarks run (``synthetic``: stages with configured costs, for
``troupe bench pipeline`` and the engine's tests).

Imports the runtime's public API and errors.
"""

__all__: list[str] = []
