"""mstar.priority: class names, order and parse errors."""

import pytest

from mstar.priority import UNCLASSED, Priority


def test_more_urgent_classes_sort_first():
    assert sorted([Priority.BATCH, Priority.CONTROL, Priority.INTERACTIVE]) == [
        Priority.CONTROL,
        Priority.INTERACTIVE,
        Priority.BATCH,
    ]
    assert UNCLASSED == Priority.INTERACTIVE


@pytest.mark.parametrize("value", ["control", " Control ", 0, Priority.CONTROL])
def test_parse_takes_names_numbers_and_members(value):
    assert Priority.parse(value) is Priority.CONTROL


@pytest.mark.parametrize("value", ["urgent", 3, True, None, 1.0])
def test_parse_errors_name_the_field_and_the_classes(value):
    with pytest.raises(ValueError) as err:
        Priority.parse(value, "ros.priority")
    assert "ros.priority" in str(err.value) and "control, interactive, batch" in str(err.value)
