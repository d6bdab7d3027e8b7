"""A placement's ``class_limits:`` reach the Conductor it places, under the limits given to the Conductor
itself; with classes off there are none."""

from __future__ import annotations

from mstar.conductor import Conductor
from mstar.priority import Priority
from support.conductor_helpers import config
from support.toy_factory import toy_spec

TOY = "world_size: 1\nnode_groups:\n  - {nodes: [llm, sum], ranks: [0]}\nclass_limits: {batch: 1, control: 3}\n"


def test_a_distributed_conductor_takes_the_placements_limits_under_its_own(tmp_path):
    path = tmp_path / "placement.yaml"
    path.write_text(TOY)
    placed = Conductor.distributed(toy_spec(), path, config=config(), launch=False)
    assert placed.class_limits.limits == {Priority.BATCH: 1, Priority.CONTROL: 3}
    given = Conductor.distributed(toy_spec(), path, config=config(), launch=False, class_limits={"batch": 2})
    assert given.class_limits.limits == {Priority.BATCH: 2, Priority.CONTROL: 3}
    off = Conductor.distributed(toy_spec(), path, config=config(priority_classes=False), launch=False)
    assert off.class_limits.limits == {}
