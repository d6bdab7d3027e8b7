"""A ROS domain for each test that no concurrently running test shares.

DDS shared memory crosses network namespaces, so two node sets on one host in the same domain see each
other's topics. Under pytest-xdist each worker takes its own residue of the domain range, so tests on
different workers never meet; on one worker, successive tests take successive domains, so a test never
meets a participant a previous test left behind. Another run on the host starts at a random offset.
"""

from __future__ import annotations

import itertools
import os
import random
import time

FIRST_DOMAIN, LAST_DOMAIN = 30, 200  # Fast DDS's ports for these stay below 65535 with localhost-only discovery


def _worker() -> tuple[int, int]:
    """(this xdist worker's index, how many workers run); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw") or 0), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def _domains():
    index, count = _worker()
    mine = [d for d in range(FIRST_DOMAIN, LAST_DOMAIN + 1) if (d - FIRST_DOMAIN) % count == index]
    start = random.Random(os.getpid() ^ time.monotonic_ns()).randrange(len(mine))
    return itertools.cycle(mine[start:] + mine[:start])


_next_domains = _domains()


def next_domain() -> int:
    return next(_next_domains)
