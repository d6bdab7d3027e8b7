"""The bundled synthetic bag: two DROID-like robots, made once under the cache and reused.

``mstar-ros demo`` plays it, and so does ``bench pi05 --flood``."""

from __future__ import annotations

from pathlib import Path

BAG_SECONDS = 20.0


def bundled_bag() -> Path:
    """The bag's folder, written the first time (rosbags only, no ROS install)."""
    from mstar_graphs.common.cache import cache_root
    from mstar_ros.bag.synthetic import SyntheticBagSpec, ensure_synthetic_bag

    spec = SyntheticBagSpec(robots=2, seconds=BAG_SECONDS, seed=0)
    return ensure_synthetic_bag(cache_root() / "bags" / f"droid-synthetic-{spec.robots}x{spec.seconds:g}s", spec)
