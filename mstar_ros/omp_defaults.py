"""OpenMP threads spin at most GOMP_SPINCOUNT=10000 before sleeping, unless the user chose (docs/performance.md)."""

from __future__ import annotations

import os
import sys

SPIN = ("GOMP_SPINCOUNT", "10000")


def apply_spin_default() -> bool:
    """Sets GOMP_SPINCOUNT=10000 unless the user chose a policy; True when it did. Too late once
    torch is imported (then it returns False and changes nothing)."""
    if os.environ.get("OMP_WAIT_POLICY") or os.environ.get(SPIN[0]):
        return False
    if "torch" in sys.modules:
        return False
    os.environ[SPIN[0]] = SPIN[1]
    return True
