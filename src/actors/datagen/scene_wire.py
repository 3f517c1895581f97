"""Scenes and plans as msgpack-able dicts, so they can travel between stage replicas."""

from __future__ import annotations

from typing import Any

import numpy as np

from .scene import Box, BoxKind, Door, RenderParams, Room, Scene, Texture
from .trajectory import Plan

__all__ = ["plan_from_wire", "plan_to_wire", "scene_from_wire", "scene_to_wire"]


def scene_to_wire(scene: Scene) -> dict[str, Any]:
    """A scene as plain data (boxes as lists; small: dozens of boxes)."""
    r = scene.render
    return {
        "seed": scene.seed,
        "size": list(scene.size),
        "ceiling": scene.ceiling,
        "rooms": [[list(room.lo), list(room.hi)] for room in scene.rooms],
        "doors": [[d.axis, d.at, d.lo, d.hi] for d in scene.doors],
        "boxes": [
            [list(b.lo), list(b.hi), list(b.color), b.kind.value, int(b.texture), b.texture_scale]
            for b in scene.boxes
        ],
        "render": [
            r.width,
            r.height,
            r.fov_deg,
            r.cam_height,
            list(r.light_dir),
            r.light_intensity,
            r.ambient,
        ],
        "variant": scene.variant,
    }


def scene_from_wire(d: dict[str, Any]) -> Scene:
    """Rebuild the Scene that ``scene_to_wire`` described."""
    w, h, fov, cam, light, intensity, ambient = d["render"]
    return Scene(
        seed=int(d["seed"]),
        size=(float(d["size"][0]), float(d["size"][1])),
        ceiling=float(d["ceiling"]),
        rooms=tuple(Room(tuple(lo), tuple(hi)) for lo, hi in d["rooms"]),
        doors=tuple(Door(int(a), float(at), float(lo), float(hi)) for a, at, lo, hi in d["doors"]),
        boxes=tuple(
            Box(tuple(lo), tuple(hi), tuple(color), BoxKind(kind), Texture(tex), float(scale))
            for lo, hi, color, kind, tex, scale in d["boxes"]
        ),
        render=RenderParams(
            int(w), int(h), float(fov), float(cam), tuple(light), float(intensity), float(ambient)
        ),
        variant=d["variant"],
    )


def plan_to_wire(plan: Plan) -> dict[str, Any]:
    """A plan as plain data; its arrays travel as buffer frames."""
    return {
        "positions": plan.positions,
        "rotations": plan.rotations,
        "timestamps": plan.timestamps,
        "fps": plan.fps,
        "actions": plan.actions,
        "waypoints": plan.waypoints,
        "length": plan.length,
        "truncated": plan.truncated,
        "start": list(plan.start),
        "goal": list(plan.goal),
    }


def plan_from_wire(d: dict[str, Any]) -> Plan:
    """Rebuild the Plan that ``plan_to_wire`` described."""
    return Plan(
        np.asarray(d["positions"]),
        np.asarray(d["rotations"]),
        np.asarray(d["timestamps"]),
        float(d["fps"]),
        np.asarray(d["actions"]),
        np.asarray(d["waypoints"]),
        float(d["length"]),
        bool(d["truncated"]),
        (int(d["start"][0]), int(d["start"][1])),
        (int(d["goal"][0]), int(d["goal"][1])),
    )
