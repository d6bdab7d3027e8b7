"""A placement's ``class_limits:``: class -> requests in flight at once, checked with errors that name the
line (the Conductor that applies them: test/runtime/distributed/test_placed_class_limits.py)."""

from __future__ import annotations

import pytest

from mstar.placement import PlacementError, PlacementFile, ResolvedPlacement
from mstar.priority import Priority
from mstar_graphs.orpheus.graph import orpheus_graph

HEAD = "world_size: 1\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\n"


def resolve(text: str) -> ResolvedPlacement:
    return ResolvedPlacement(orpheus_graph(), PlacementFile.parse(text, "p.yaml"))


def test_class_limits_resolve_to_classes():
    p = resolve(HEAD + "class_limits:\n  batch: 1\n  INTERACTIVE: 4\n")
    assert p.class_limits == {Priority.BATCH: 1, Priority.INTERACTIVE: 4}
    assert resolve(HEAD).class_limits == {}


@pytest.mark.parametrize(
    "text,needle,line",
    [
        (HEAD + "class_limits:\n  batch: 1\n  later: 2\n", "class_limits.later: class: 'later' is not", 6),
        (HEAD + "class_limits:\n  batch: 0\n", "class_limits.batch: 0 is not an in-flight limit", 5),
        (HEAD + "class_limits:\n  batch: many\n", "class_limits.batch: 'many' is not an in-flight limit", 5),
        (HEAD + "class_limits:\n  batch: true\n", "class_limits.batch: True is not an in-flight limit", 5),
        (HEAD + "class_limits: [batch]\n", "Expected `object`", 4),
    ],
)
def test_class_limit_errors_name_the_field_and_line(text, needle, line):
    with pytest.raises(PlacementError) as err:
        resolve(text)
    message = str(err.value)
    assert needle in message and message.startswith(f"p.yaml:{line}:"), message
