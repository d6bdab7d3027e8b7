"""The MoT layer's row routing and parameter names (the parity with the reference is in test_llm)."""

from __future__ import annotations

import torch

from mstar_graphs.bagel.checkpoints import checkpoint_name
from mstar_graphs.bagel.mot_layer import RowSplit
from mstar_graphs.bagel.tiny import llm_weight_shapes
from support.dense_kv_attention import DenseKVAttention


def test_parameter_names_are_the_checkpoints(model, config):
    ours = {checkpoint_name(name): tuple(t.shape) for name, t in model.state_dict().items()}
    released = {name: shape for name, shape, _ in llm_weight_shapes(config.llm, config.dims)}
    assert ours == released


def test_row_split_round_trip():
    gen = torch.tensor([False, True, True, False, True])
    rows = RowSplit.from_mask(gen)
    assert rows.und.tolist() == [0, 3] and rows.gen.tolist() == [1, 2, 4]
    x = torch.arange(10.0).reshape(5, 2)
    und, gen_part = rows.split(x)
    assert torch.equal(rows.merge(und, gen_part), x)
    assert RowSplit.from_mask(torch.zeros(5, dtype=torch.bool)) is None and RowSplit.from_mask(None) is None


@torch.no_grad()
def test_split_path_with_no_gen_rows_equals_the_fast_path(model):
    layer = model.model.layers[0]
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    cos, sin = model.rope_cos[:6], model.rope_sin[:6]
    fast = layer(x, cos, sin, DenseKVAttention(2))
    all_und = RowSplit(und=torch.arange(6), gen=torch.zeros(0, dtype=torch.long), total=6)
    assert torch.allclose(layer(x, cos, sin, DenseKVAttention(2), all_und), fast, atol=1e-6)
    all_gen = RowSplit(und=torch.zeros(0, dtype=torch.long), gen=torch.arange(6), total=6)
    assert not torch.allclose(layer(x, cos, sin, DenseKVAttention(2), all_gen), fast, atol=1e-3)
