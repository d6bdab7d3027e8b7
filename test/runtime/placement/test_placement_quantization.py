"""Per-node-group ``quantization:`` in placement files: parsed, checked, handed to each rank."""

from __future__ import annotations

import pytest

from mstar.placement import PlacementError, PlacementFile, ResolvedPlacement
from mstar_graphs.orpheus.graph import orpheus_graph


def resolve(text: str) -> ResolvedPlacement:
    return ResolvedPlacement(orpheus_graph(), PlacementFile.parse(text, "p.yaml"))


def test_each_rank_gets_its_groups_quantization():
    p = resolve(
        "world_size: 2\nnode_groups:\n  - {nodes: [llm], ranks: [0], quantization: int8}\n  - {nodes: [snac], ranks: [1]}\n"
    )
    assert p.lookup("llm", "decode").quantization == "int8"
    assert p.quantization_on(0) == {"llm": "int8"}
    assert p.quantization_on(1) == {}, "a group that sets none follows the engine config"


def test_unknown_quantization_names_the_field_and_line():
    with pytest.raises(PlacementError) as err:
        resolve("world_size: 1\nnode_groups:\n  - nodes: [llm, snac]\n    ranks: [0]\n    quantization: int3\n")
    message = str(err.value)
    assert message.startswith("p.yaml:5: node_groups[0].quantization: unknown quantization 'int3'"), message


def test_one_module_is_quantized_alike_in_every_group():
    with pytest.raises(PlacementError, match="module 'llm'.*one quantization"):
        resolve(
            "world_size: 2\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0], quantization: int8}\n"
            "  - {nodes: [llm], ranks: [1], walks: [decode], quantization: int4}\n"
        )


@pytest.mark.parametrize("explicit", ["none", "int8"])
def test_a_group_that_sets_no_quantization_is_not_compared_with_one_that_does(explicit):
    """Unset follows the engine config: an explicit value beside it is no conflict the placement can see."""
    p = resolve(
        "world_size: 2\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\n"
        f"  - {{nodes: [llm], ranks: [1], walks: [decode], quantization: {explicit}}}\n"
    )
    assert p.quantization_on(1) == {"llm": explicit}
    assert p.quantization_on(0) == {}
