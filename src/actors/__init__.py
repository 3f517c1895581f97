"""actors: the domain code troupe ships, written on the runtime as any user's actors would be.

``datagen`` (the data generation lifecycle and what it is built of), ``lerobot`` (LeRobot
datasets), ``codecs`` (codec extensions: torch tensors), ``demo`` (small actors and task actors
that show troupe working) and ``bench`` (the benchmarks' stages); each says what it may import.

Imports troupe.runtime and troupe.models; nothing from troupe.cli. The runtime imports nothing of
it: the CLI and configs name its classes by import path (``module:Class``).
"""
