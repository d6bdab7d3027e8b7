"""What the engines refuse of weight-only quantization, naming the field: a device other than the CPU
(its kernels are CPU ones: the linears would stay unquantized without a word), and views of one module
asking for different modes (the module is quantized once)."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.config import EngineConfig
from mstar.engine.core_builder import build_core
from mstar.engine.stateless_engine import StatelessEngine
from mstar.transport.inprocess import InProcessTensorStore
from support.toy_models import Scale, ToyLM

META = torch.device("meta")  # a non-CPU device every machine has


def test_the_ar_engine_core_refuses_quantization_off_cpu():
    config = EngineConfig(num_kv_blocks=4, block_size=4, dtype="float32", quantization="int8")
    with pytest.raises(ValueError, match=r"llm: quantization 'int8' runs on CPU only \(device is 'meta'\)"):
        build_core(ToyLM(), InProcessTensorStore(), config, META, "llm", None)


def test_the_stateless_engine_refuses_quantization_off_cpu_for_any_node():
    store = InProcessTensorStore()
    with pytest.raises(ValueError, match=r"enc: quantization 'int4' runs on CPU only"):
        StatelessEngine({"scale": Scale()}, store, device=META, name="enc", quantization={"scale": "int4"})
    engine = StatelessEngine({"scale": Scale()}, store, device=META, quantization={"scale": "none"}, pack=False)
    assert engine.device == META  # "none" stays allowed everywhere


def test_views_of_one_module_must_agree_on_their_quantization():
    shared = Scale()
    store = InProcessTensorStore()
    with pytest.raises(ValueError, match=r"enc: quantization: nodes 'a' \(int8\) and 'b' \(none\) share one module"):
        StatelessEngine({"a": shared, "b": shared}, store, name="enc", quantization={"a": "int8"})
    engine = StatelessEngine({"a": shared, "b": shared}, store, quantization={"a": "int8", "b": "int8"})
    assert set(engine.nodes) == {"a", "b"}
