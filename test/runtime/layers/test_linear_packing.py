"""Prepacked bf16 linears: same numbers as nn.Linear, chosen only where they can run."""

from __future__ import annotations

import asyncio
import copy
import io
import os

import pytest
import torch
from torch import nn

from mstar.conductor import Conductor
from mstar.engine.config import EngineConfig
from mstar.layers import linear_packing
from mstar.layers.linear_packing import PackedLinear, linear_rows, pack_linears, packing_available, parameter_count
from mstar.sampling_params import SamplingParams
from mstar_graphs.orpheus.frontend import OrpheusTTS


def _mlp(dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Module()
    m.up = nn.Linear(48, 96)
    m.down = nn.Linear(96, 48, bias=False)
    m.head = nn.Linear(48, 100, bias=False)
    m.embed = nn.Embedding(100, 48)
    m.head.weight = m.embed.weight  # tied: must stay a plain Linear
    m.skip = nn.Linear(48, 48)
    return m.to(dtype)


def _run(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m.head(m.down(torch.relu(m.up(x))) + m.skip(x))


def _cpu_has_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


PACKS = packing_available()


def test_packing_is_chosen_where_the_cpu_supports_it():
    # On these x86 machines (avx512_bf16) the packed path must be the one taken, unless oneDNN is held
    # below it (ONEDNN_MAX_CPU_ISA, as when emulating an AVX2-only CPU); elsewhere the plain fallback
    # is, and the tests below check that one instead.
    if _cpu_has_bf16() and not os.environ.get("ONEDNN_MAX_CPU_ISA"):
        assert PACKS, "oneDNN bf16 linears unavailable on a CPU with avx512_bf16"
    assert pack_linears(_mlp()) == (3 if PACKS else 0)


@pytest.mark.parametrize("rows", [1, 8, 77])
def test_packed_outputs_equal_plain_bitwise(rows):
    m = _mlp()
    x = torch.randn(rows, 48).bfloat16()
    expected = _run(m, x)
    assert pack_linears(m, keep_plain=("skip",)) == (2 if PACKS else 0)
    assert isinstance(m.up, PackedLinear) == PACKS and isinstance(m.down, PackedLinear) == PACKS
    assert type(m.skip) is nn.Linear, "named in keep_plain"
    assert type(m.head) is nn.Linear, "its weight is tied to the embedding"
    assert torch.equal(_run(m, x), expected)
    assert torch.equal(m.up(x.view(1, rows, 48)), m.up(x).view(1, rows, 96)), "batched (3-D) input"
    assert parameter_count(m) == sum(p.numel() for p in _mlp().parameters()), "packed weights still count"
    assert pack_linears(m) == (1 if PACKS else 0), "idempotent: only the one left plain by keep_plain is packed now"


def test_weight_read_unpacks_and_to_round_trips():
    m = _mlp()
    original = m.up.weight.detach().clone()
    x = torch.randn(5, 48).bfloat16()
    expected = m.up(x)
    m.up = PackedLinear(m.up, "up") if PACKS else m.up
    assert torch.equal(m.up.weight, original)
    packed = getattr(m.up, "packed", None)
    m.to(device="cpu", dtype=torch.bfloat16)  # what every engine does: nothing to convert, nothing repacked
    assert getattr(m.up, "packed", None) is packed and torch.equal(m.up(x), expected)
    m.to(torch.float32)  # leaves the packed layout behind: a dense fp32 weight
    assert getattr(m.up, "packed", None) is None and m.up.weight.dtype == torch.float32
    assert torch.allclose(m.up(x.float()), expected.float(), atol=0.1)
    m.to(torch.bfloat16)  # and packs again
    assert (getattr(m.up, "packed", None) is not None) == PACKS
    assert torch.equal(m.up(x), expected)


def test_deepcopy_and_pickle_carry_the_weight():
    m = _mlp()
    x = torch.randn(4, 48).bfloat16()
    expected = m.up(x)
    m.up = PackedLinear(m.up, "up") if PACKS else m.up
    copied = copy.deepcopy(m)  # a packed tensor has no storage: it must travel dense and pack again
    assert torch.equal(copied.up(x), expected)
    assert (getattr(copied.up, "packed", None) is not None) == PACKS
    buffer = io.BytesIO()
    torch.save(m.up, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False)(x), expected)


def test_fp32_and_unavailable_leave_modules_alone(monkeypatch):
    m = _mlp(torch.float32)
    assert pack_linears(m) == 0 and type(m.up) is nn.Linear
    monkeypatch.setattr(linear_packing, "packing_available", lambda: False)
    b = _mlp()
    assert pack_linears(b) == 0 and type(b.up) is nn.Linear
    x, w = torch.randn(3, 48).bfloat16(), torch.randn(300, 48).bfloat16()
    assert torch.equal(linear_rows(x, w, 10, 40), x @ w[10:40].T)


def test_linear_rows_packs_ranges_once_and_sees_updates():
    x, w = torch.randn(4, 48).bfloat16(), torch.randn(300, 48).bfloat16()
    plain = torch.nn.functional.linear(x, w[100:164])
    assert torch.equal(linear_rows(x, w, 100, 164), plain)
    assert torch.equal(linear_rows(x, w, 100, 164), plain)
    assert len(linear_packing._row_packs.get(id(w), {})) == (1 if PACKS else 0), "one cached pack per range"
    w[100:164].zero_()  # an in-place update (weight reloaded) must not serve stale rows
    assert torch.equal(linear_rows(x, w, 100, 164), torch.zeros(4, 64, dtype=torch.bfloat16))
    fresh = torch.randn(300, 48).bfloat16()
    w.data = fresh  # new storage, as the weight loader assigns it
    assert torch.equal(linear_rows(x, w, 100, 164), torch.nn.functional.linear(x, fresh[100:164]))
    linear_rows(x, w, 0, 60)
    assert sum(k[1] - k[0] for k in linear_packing._row_packs.get(id(w), {})) <= 300 // 4, "a quarter at most"
    assert torch.equal(linear_rows(x, w, 0, 200), torch.nn.functional.linear(x, fresh[:200])), "too big: plain"
    key = id(w)
    del w
    assert key not in linear_packing._row_packs, "dropped with its weight"


def _serve(tts: OrpheusTTS, config: EngineConfig, text: str) -> tuple[list[int], torch.Tensor, int]:
    async def go():
        async with Conductor(tts.graph(), tts.modules(), config=config) as c:
            result = await c.submit(tts.request(text, sampling=SamplingParams(max_tokens=56, seed=3))).collect()
        return [int(t) for t in result["tokens"]], torch.cat(result["audio"])

    tokens, audio = asyncio.run(go())
    packed = sum(isinstance(m, PackedLinear) for m in tts.llm.modules())
    return tokens, audio, packed


def test_bf16_engine_serves_the_same_tokens_and_audio_packed_or_not():
    text = "Packed weights change nothing."
    plain = _serve(OrpheusTTS.load(progress=False), EngineConfig(dtype="bfloat16", pack_linears=False), text)
    packed = _serve(OrpheusTTS.load(progress=False), EngineConfig(dtype="bfloat16"), text)
    assert plain[2] == 0 and (packed[2] > 0) == PACKS
    assert packed[0] == plain[0] and len(plain[0]) >= 28
    assert torch.equal(packed[1], plain[1])
