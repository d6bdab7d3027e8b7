"""Placement files: parsing, resolution per Walk, and errors that name the field and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from mstar.placement import PlacementError, PlacementFile, ResolvedPlacement, load_placement
from mstar_graphs.orpheus.graph import orpheus_graph

CONFIG = Path(__file__).parents[3] / "config" / "placement"


def resolve(text: str) -> ResolvedPlacement:
    return ResolvedPlacement(orpheus_graph(), PlacementFile.parse(text, "p.yaml"))


def test_shipped_examples_resolve():
    two = load_placement(str(CONFIG / "orpheus-two-ranks.yaml"), orpheus_graph())
    assert two.lookup("llm", "decode").ranks == (0,) and two.lookup("snac", None).ranks == (1,)
    assert two.device_of(1) == "cpu" and two.ranks_used() == [0, 1]
    pd = load_placement(str(CONFIG / "orpheus-pd-disaggregated.yaml"), orpheus_graph())
    assert pd.lookup("llm", "prefill").ranks == (0,) and pd.lookup("llm", "decode").ranks == (1,)


def test_walk_scoped_group_wins_over_unscoped():
    p = resolve(
        "world_size: 2\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\n"
        "  - {nodes: [llm], ranks: [1], walks: [decode]}\n"
    )
    assert p.lookup("llm", "prefill").ranks == (0,) and p.lookup("llm", "decode").ranks == (1,)


def test_tensor_parallel_group():
    p = resolve(
        "world_size: 2\nnode_groups:\n  - {nodes: [llm], ranks: [0, 1], tp_size: 2}\n  - {nodes: [snac], ranks: [1]}\n"
    )
    assert p.lookup("llm", "decode").tp_size == 2 and p.lookup("llm", "decode").ranks == (0, 1)


@pytest.mark.parametrize(
    "text, needle, line",
    [
        (
            "world_size: 2\nnode_groups:\n  - nodes: [llm, vocoder]\n    ranks: [0]\n  - {nodes: [snac], ranks: [1]}\n",
            "node_groups[0].nodes[1]: unknown node 'vocoder'",
            3,
        ),
        (
            "world_size: 2\nnode_groups:\n  - nodes: [llm]\n    ranks: [0]\n  - nodes: [snac]\n    ranks: [2]\n",
            "node_groups[1].ranks[0]: rank 2 is out of range (world_size 2)",
            6,
        ),
        (
            "world_size: 2\nnode_groups:\n  - nodes: [llm]\n    ranks: [0]\n    walks: [prefill, generate]\n"
            "  - {nodes: [snac], ranks: [1]}\n",
            "node_groups[0].walks[1]: graph 'orpheus' has no walk 'generate'",
            5,
        ),
        (
            "world_size: 2\nnode_groups:\n  - nodes: [llm]\n    ranks: [0]\n    walks: [prefill]\n"
            "  - {nodes: [snac], ranks: [1]}\n",
            "node 'llm' is placed nowhere for walk 'decode'",
            2,
        ),
        ("world_size: 1\nnode_groups:\n  - nodes: [llm]\n    ranks: [0]\n", "node 'snac'", 2),
        (
            "world_size: 2\nnode_groups:\n  - nodes: [llm]\n    ranks: [0]\n    tp_size: 2\n",
            "tp_size 2 needs exactly",
            5,
        ),
        (
            "world_size: 2\nnode_groups:\n  - nodes: [llm, snac]\n    ranks: [0]\n  - nodes: [llm]\n    ranks: [1]\n",
            "node 'llm' is already placed for every walk by node_groups[0]",
            5,
        ),
        ("world_size: two\nnode_groups: []\n", "world_size", 1),
        ("world_size: 2\nnode_groups:\n  - nodes: [llm]\n    rank: [0]\n", "rank", 3),
        (
            "world_size: 2\ndevices: {0: cpu, 1: gpu0}\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\n",
            "devices[1]: device 'gpu0' is not 'cpu' or 'cuda:N'",
            2,
        ),
        (
            "world_size: 2\nnode_groups:\n  - nodes: [llm\n",
            "not valid YAML: expected ',' or ']', but got '<stream end>' (column 1), while parsing a flow sequence at line 3",
            4,
        ),
        (
            "world_size: 2\nbase: &b {nodes: [llm, snac], ranks: [0]}\nnode_groups: [*b]\n",
            "not valid YAML: aliases are not accepted (*b): write the value out",
            3,
        ),
        (
            "world_size: 2\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\ntransport:\n  default: udp\n",
            "transport.default: unknown transport 'udp'",
            5,
        ),
        (
            "world_size: 2\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\ntransport:\n  edges:\n    llm.audio: tcp\n",
            "transport.edges.llm.audio: 'llm.audio' is not an output of a node",
            6,
        ),
        (
            "world_size: 2\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\ntransport:\n  edges:\n    llm.token: rdma\n",
            "unknown transport 'rdma'",
            6,
        ),
        (
            "world_size: 2\nnode_groups:\n  - {nodes: [llm], ranks: [0, 0], tp_size: 2}\n  - {nodes: [snac], ranks: [1]}\n",
            "names a rank twice",
            3,
        ),
    ],
)
def test_errors_name_the_field_and_line(text, needle, line):
    with pytest.raises(PlacementError) as err:
        resolve(text)
    message = str(err.value)
    assert needle in message, message
    if line is not None:
        assert message.startswith(f"p.yaml:{line}:"), message


def test_nested_aliases_are_refused_unexpanded(tmp_path):
    """Nine levels of nine aliases once took the loader to 3.1 GB (its line mapper walked them); six levels
    (531441 values) show it in a second. Now the first alias ends it."""
    laughs = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * 9) + "]\n" for i in range(6))
    path = tmp_path / "laughs.yaml"
    path.write_text("world_size: 1\n" + laughs + "node_groups: [{nodes: [llm, snac], ranks: [0]}]\n")
    with pytest.raises(PlacementError, match=rf"^{path}:3: not valid YAML: aliases are not accepted \(\*l0\)"):
        PlacementFile.load(path)


def test_a_kv_view_must_sit_with_the_view_it_forks_from():
    from support.toy_flow import flow_graph

    text = "world_size: 2\nnode_groups:\n  - {nodes: [prefix], ranks: [0]}\n  - {nodes: [act], ranks: [1]}\n"
    with pytest.raises(
        PlacementError, match=r"p.yaml:4: node_groups\[1\].nodes: node 'act' forks its KV from 'prefix'"
    ):
        ResolvedPlacement(flow_graph(), PlacementFile.parse(text, "p.yaml"))


def test_skipped_walks_need_no_placement_and_refuse_their_requests():
    from mstar.conductor.routing import Router
    from support.toy_flow import flow_graph

    text = "world_size: 2\nskip_walks: [act]\nnode_groups:\n  - {nodes: [prefix], ranks: [1]}\n"
    placement = ResolvedPlacement(flow_graph(), PlacementFile.parse(text, "p.yaml"))
    router = Router(flow_graph(), placement)
    assert router.rank_for("prefix", "prefill") == 1 and placement.placements_of("act") == []
    with pytest.raises(ValueError, match=r"walk 'act' is not served by placement p.yaml \(its skip_walks\)"):
        router.rank_for("act", "act")
    with pytest.raises(PlacementError, match=r"p.yaml:3: node_groups: node 'act' is placed nowhere for walk 'act'"):
        ResolvedPlacement(
            flow_graph(), PlacementFile.parse(text.replace("skip_walks: [act]", "skip_walks: []"), "p.yaml")
        )
    with pytest.raises(PlacementError, match=r"p.yaml:2: skip_walks\[0\]: graph 'toy_flow' has no walk 'decode'"):
        ResolvedPlacement(flow_graph(), PlacementFile.parse(text.replace("[act]", "[decode]"), "p.yaml"))
