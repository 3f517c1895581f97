"""demo: small actors and a task actor that show troupe working (``troupe demo``, the example job,
the tests).

Imports the runtime's public API (and the task actor, the content store and the output store).
"""

__all__: list[str] = []
