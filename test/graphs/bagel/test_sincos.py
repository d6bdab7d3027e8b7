"""The 2-D sin-cos table (column coordinate first, sin before cos) and the timestep frequencies (cos first)."""

from __future__ import annotations

import math

import pytest
import torch

from mstar_graphs.bagel.sincos import SinCosPositionTable, sincos_2d_table, timestep_frequencies


def test_table_values_column_first():
    grid, dim = 5, 8  # each coordinate: 4 values = sin(w0 x), sin(w1 x), cos(w0 x), cos(w1 x); w = 1, 0.01
    table = sincos_2d_table(dim, grid)
    assert table.shape == (25, 8) and table.dtype == torch.float32

    def expected(r: int, c: int) -> list[float]:
        one = lambda x: [math.sin(x), math.sin(0.01 * x), math.cos(x), math.cos(0.01 * x)]  # noqa: E731
        return one(c) + one(r)  # the column's half comes first

    for r, c in [(0, 3), (3, 0), (2, 4), (4, 4)]:
        assert table[r * grid + c].tolist() == pytest.approx(expected(r, c), abs=1e-7), (r, c)
    assert table[3].tolist()[4:] == [0.0, 0.0, 1.0, 1.0]  # row 0, column 3: the row half is position 0


def test_table_wide_frequencies_and_bad_width():
    table = sincos_2d_table(16, 3)  # quarter 4: w_k = 10000 ** (-k / 4)
    c = 2
    assert table[c, 1].item() == pytest.approx(math.sin(c * 10000 ** (-1 / 4)), abs=1e-7)
    assert table[c, 7].item() == pytest.approx(math.cos(c * 10000 ** (-3 / 4)), abs=1e-7)
    with pytest.raises(ValueError, match="multiple of 4"):
        sincos_2d_table(6, 3)
    module = SinCosPositionTable(3, 16)
    assert not module.pos_embed.requires_grad and "pos_embed" in module.state_dict()
    assert torch.equal(module(torch.tensor([2, 0])), table[[2, 0]])


def test_timestep_frequencies_cos_first():
    emb = timestep_frequencies(torch.tensor([0.0, 0.5]))
    assert emb.shape == (2, 256)
    assert emb[0].tolist() == [1.0] * 128 + [0.0] * 128
    f = lambda k: math.exp(-math.log(10000) * k / 128)  # noqa: E731
    for k in (0, 1, 64, 127):
        assert emb[1, k].item() == pytest.approx(math.cos(0.5 * f(k)), abs=1e-6)
        assert emb[1, 128 + k].item() == pytest.approx(math.sin(0.5 * f(k)), abs=1e-6)
    assert timestep_frequencies(torch.tensor([1.0]), dim=5).shape == (1, 5)
