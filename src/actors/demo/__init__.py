"""demo: small actors and a task actor that show troupe working (``troupe demo``, the example job,
the tests).

Imports the runtime's public API (and the task actor and content store).
"""

__all__: list[str] = []
