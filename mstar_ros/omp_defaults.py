"""How long torch's OpenMP threads spin at a barrier before sleeping: bounded by default in every program.

libgomp's default (GOMP_SPINCOUNT 300000) keeps a team's threads spinning; when another busy
process shares the cores, a spinning team collapses: a two-robot pi0.5 forward went from 0.05 s
to 4-5 s next to a torch load on 2 cores, and the pi0.5 bench forward from ~0.4 s to 2.1-2.8 s
under other processes' load (even in a clean process), while 10000 spins stayed at 0.05 s alone
and 0.2 s next to that load. Set before torch is imported (libgomp reads it once); Worker
processes inherit it. Not applied when you set OMP_WAIT_POLICY or GOMP_SPINCOUNT yourself.
"""
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
