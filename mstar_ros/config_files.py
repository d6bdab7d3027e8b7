"""Where the shipped ``config/`` files are, in a working tree and in an installed package.

A working tree (and the editable install that maps it) has them in ``config/`` beside the
package; ``pip install .`` and colcon put them in ``<prefix>/share/mstar_ros/config/``
(setup.py's data_files). The source tree's copy comes first, so a developer's edit is what
runs; then the share directory ament finds (AMENT_PREFIX_PATH, as ``ros2 launch`` does);
then the prefix this package is installed in (``<prefix>/lib/pythonX.Y/site-packages/
mstar_ros``: a ``--prefix`` or ``--user`` install); then this interpreter's own prefix.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "mstar_ros"


def config_candidates(name: str) -> list[Path]:
    """The paths ``config/NAME`` is looked for at, in order."""
    here = Path(__file__).resolve()
    candidates = [here.parents[1] / "config" / name]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory(PACKAGE)) / "config" / name)
    except Exception:  # no ROS install, AMENT_PREFIX_PATH unset, or the package not indexed there
        pass
    if len(here.parents) > 4 and here.parents[3].name in (
        "lib",
        "lib64",
    ):  # <prefix>/lib/pythonX.Y/site-packages/mstar_ros
        candidates.append(here.parents[4] / "share" / PACKAGE / "config" / name)
    candidates.append(Path(sys.prefix) / "share" / PACKAGE / "config" / name)
    return list(dict.fromkeys(candidates))  # once each


def find_config(name: str) -> Path | None:
    """The first of :func:`config_candidates` that is a file, or None."""
    return next((p for p in config_candidates(name) if p.is_file()), None)


def required_config(name: str, argument: str) -> Path:
    """The first of :func:`config_candidates` that is a file; FileNotFoundError naming where it looked
    and the launch ``argument`` that would give the file instead."""
    found = find_config(name)
    if found is None:
        looked = ", ".join(map(str, config_candidates(name)))
        raise FileNotFoundError(f"{name} not found (looked at {looked}); give {argument}")
    return found
