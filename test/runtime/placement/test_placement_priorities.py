"""A placement's ``priorities:``: node or walk name -> class, checked with errors that name the line."""

from __future__ import annotations

import pytest

from mstar.placement import PlacementError, PlacementFile, ResolvedPlacement
from mstar.priority import Priority
from mstar_graphs.orpheus.graph import orpheus_graph

HEAD = "world_size: 1\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\n"


def resolve(text: str) -> ResolvedPlacement:
    return ResolvedPlacement(orpheus_graph(), PlacementFile.parse(text, "p.yaml"))


def test_priorities_resolve_to_classes():
    p = resolve(HEAD + "priorities:\n  decode: batch\n  snac: CONTROL\n")
    assert p.priorities == {"decode": Priority.BATCH, "snac": Priority.CONTROL}
    assert resolve(HEAD).priorities == {}


@pytest.mark.parametrize(
    "text,needle,line",
    [
        (HEAD + "priorities:\n  decode: batch\n  snac: urgent\n", "priorities.snac: class: 'urgent' is not", 6),
        (HEAD + "priorities:\n  vae: batch\n", "priorities.vae: 'vae' is neither a node nor a walk", 5),
        (HEAD + "priorities: [batch]\n", "Expected `object`", 4),
    ],
)
def test_priority_errors_name_the_field_and_line(text, needle, line):
    with pytest.raises(PlacementError) as err:
        resolve(text)
    message = str(err.value)
    assert needle in message and message.startswith(f"p.yaml:{line}:"), message
