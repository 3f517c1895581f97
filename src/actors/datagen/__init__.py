"""datagen: the data generation lifecycle, Load -> Plan -> Render -> Store, as pipeline stage
actors (``lifecycle``), its default pipeline (``config``), and what they are built of: scenes,
domain randomization, occupancy grids, A*, trajectories, camera poses, the glue to the renderer.

Imports the runtime (errors, the stage actor, the output store, pipeline config), troupe.models
and actors.lerobot (the Store stage writes LeRobot episodes).
"""

__all__: list[str] = []
