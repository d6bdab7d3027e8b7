"""mstar_ros.bench.ours_decode: a greedy run gives its sequences back to the engine, failed or not."""

from __future__ import annotations

import itertools

import pytest

from mstar_ros.bench.ours_decode import OursDecoder


def test_a_failed_greedy_run_still_releases_its_sequences():
    released: list[str] = []
    decoder = object.__new__(OursDecoder)  # no model: the engine calls are stood in for
    decoder._ids = itertools.count()
    decoder.engine = type("Engine", (), {"release": lambda self, name: released.append(name)})()
    decoder._call = lambda name, ids, loop: name

    def tokens(name):
        raise RuntimeError(f"our engine failed on {name}")

    decoder._tokens = tokens
    with pytest.raises(RuntimeError, match="our engine failed"):
        decoder.greedy([[1, 2], [3, 4]], new_tokens=4)
    assert released == ["decode-0-0", "decode-0-1"]
