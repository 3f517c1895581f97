"""security: CURVE keys on disk (``keys``; ``key_files`` writes new ones), the process's keys
(``process``), those a node hands its children for its life (``snapshot``), the ZAP
authenticator that admits only authorised peers (``auth``) and who may send which control
message (``roles``).

Imports troupe.runtime.errors and core's peer limits; nothing from transports, node,
supervision, chaos, tasks, pipeline or testing.
"""

__all__: list[str] = []
