"""Markers a developer selects parts of the suite by (`pytest -m "not ros and not browser"`).

CI runs everything; the markers only let a person run a part. `ros` (real rclpy over DDS, bag
playback) is given here to whole folders; `browser` (headless Chromium or Firefox) and `slow`
(over ~5 s on 2 cores) are written on the tests themselves. setup.cfg registers them and
`--strict-markers` turns a misspelt marker into an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TEST_ROOT = Path(__file__).resolve().parent
# folders whose every test starts ROS 2 (rclpy, DDS) or plays a bag into it
ROS_FOLDERS = (TEST_ROOT / "mstar_ros_tests" / "ros", TEST_ROOT / "mstar_ros_tests" / "bag")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if any(folder in path.parents for folder in ROS_FOLDERS):
            item.add_marker(pytest.mark.ros)
