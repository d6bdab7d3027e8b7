"""The BAGEL node's ``priority`` parameter (mstar_ros.ros.bagel.params): '' (each request its own class) by
default, a class name otherwise; anything else ends the node naming the parameter."""

from __future__ import annotations

import pytest

from mstar_ros.ros.bagel.params import PARAMETERS, validate

DEFAULTS = {name: default for name, (default, _) in PARAMETERS.items()}


def test_priority_is_each_requests_own_by_default_or_one_class():
    assert validate(DEFAULTS, "/r1/bagel").priority == ""
    assert validate({**DEFAULTS, "priority": "control"}, "/r1/bagel").priority == "control"


def test_a_bad_priority_names_the_parameter():
    with pytest.raises(ValueError, match=r"/r1/bagel: parameter priority: Invalid enum value .urgent."):
        validate({**DEFAULTS, "priority": "urgent"}, "/r1/bagel")
