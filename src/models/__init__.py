"""models: the numerical models the actors use, in torch: pinhole cameras (``camera``) and the
batched ray/box renderer (``raycast``). Pure functions of tensors, no actors, no I/O.

Imports torch and numpy; nothing from troupe.runtime, troupe.actors or troupe.cli.
"""
