"""Placement files: nodes -> ranks and devices, optionally per Walk, with tensor-parallel sizes."""

from mstar.placement.resolve import NodePlacement, ResolvedPlacement, load_placement
from mstar.placement.schema import NodeGroup, Placement, PlacementError, PlacementFile

__all__ = [
    "NodeGroup",
    "NodePlacement",
    "Placement",
    "PlacementError",
    "PlacementFile",
    "ResolvedPlacement",
    "load_placement",
]
