"""Whether a placement puts BAGEL's guidance views apart, which decides how guided images are served.

The engine-resident guided flow (``image_gen_cfg``) steps over the three views' KV in one engine, so it
needs them on one Worker; views on different ranks (M*'s CFG-parallel,
config/placement/bagel-cfg-parallel.yaml) need the Walk-driven flow (``image_gen_cfg_parallel``,
mstar_graphs.bagel.cfg_parallel), whose requests are laid out for it. This reads the placement so that
choice follows the file, not a flag the caller must remember.
"""

from __future__ import annotations

from pathlib import Path

from mstar.graph.model_graph import ModelGraph
from mstar.placement import ResolvedPlacement, load_placement

GUIDANCE_VIEWS = ("llm", "llm_cfg_text", "llm_cfg_img")  # the full context, no text, no image


def views_apart(placement: ResolvedPlacement) -> bool:
    """True when any two guidance views are placed on different ranks (in any Walk)."""
    where = {frozenset(p.ranks for p in placement.placements_of(view)) for view in GUIDANCE_VIEWS}
    return len(where) > 1


def placement_splits_views(placement: str | Path | ResolvedPlacement, graph: ModelGraph) -> bool:
    """``views_apart`` of a placement YAML (checked against ``graph``, errors naming its field) or a resolved one."""
    if not isinstance(placement, ResolvedPlacement):
        placement = load_placement(str(placement), graph)
    return views_apart(placement)
