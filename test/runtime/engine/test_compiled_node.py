"""A stateless node's forward under torch.compile (``compile`` in the engine config): compiled at start for
the batches its module names, one graph for a lone call and one for any larger batch, the eager forward's
results, nothing compiled while serving, and clear refusals where it cannot run."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import mstar.engine.compiled_node as compiled_node
from mstar.engine.compile_support import graph_count
from mstar.engine.compiled_node import compile_nodes
from mstar.engine.device_loop import run_on_device
from mstar.engine.messages import ExecuteNode
from mstar.engine.stateless_engine import StatelessEngine
from mstar.graph.node import NodeSubmodule
from mstar.transport.inprocess import InProcessTensorStore

CPU = torch.device("cpu")


class _Codec(NodeSubmodule):
    """A small convolutional decoder: ``codes`` [B, 8] float, a crop ``keep`` (start, end) -> ``audio``."""

    def __init__(self, warm: bool = True) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.up = torch.nn.ConvTranspose1d(1, 4, 4, stride=2)
        self.conv = torch.nn.Conv1d(4, 1, 3, padding=1)
        for p in self.parameters():
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        self.warm = warm

    def prepare_inputs(self, calls) -> dict[str, Any]:
        return {**super().prepare_inputs(calls), "keep": (2, 12)}

    def warm_up_batches(self) -> list[dict[str, Any]]:
        if not self.warm:
            return []
        return [{"codes": torch.ones(calls, 8), "keep": (2, 12)} for calls in (1, 2)]

    def forward(self, **batch: Any) -> dict[str, torch.Tensor]:
        start, end = batch["keep"]
        x = torch.tanh(self.up(batch["codes"][:, None]))
        return {"audio": (self.conv(x) * 0.5 + x.mean(1, keepdim=True)).sin()[:, 0, start:end]}


def _served(compiled, batches: list[dict[str, Any]]) -> list[torch.Tensor]:
    def run() -> list[torch.Tensor]:  # on the device thread, as an engine serves (guards check its threads)
        with torch.inference_mode():
            return [compiled(**batch)["audio"] for batch in batches]

    return run_on_device(run)


def test_a_node_is_compiled_for_its_warm_up_batches_and_serves_any_batch_size_without_compiling(caplog):
    codec = _Codec()
    with caplog.at_level(logging.INFO, logger="mstar.engine"):
        compiled = compile_nodes({"vocoder": codec, "view": codec}, CPU, "stateless:0", True, lambda node: "none")
    assert compiled["vocoder"] is compiled["view"]  # views of one module share its graphs
    assert compiled["vocoder"].graphs == 2  # one call; any number from 2 on
    assert "stateless:0: node 'vocoder': forward compiled" in caplog.text
    gen = torch.Generator().manual_seed(1)
    batches = [{"codes": torch.randn(calls, 8, generator=gen), "keep": (2, 12)} for calls in (1, 3, 7, 2)]
    before = graph_count()
    got = _served(compiled["vocoder"], batches)
    assert graph_count() == before  # every batch size ran a warm-up graph
    want = _served(codec, batches)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    other = [{"codes": torch.randn(2, 8, generator=gen), "keep": (0, 16)}]  # a crop no graph was made for
    assert torch.equal(_served(compiled["vocoder"], other)[0], _served(codec, other)[0])  # eager: bit for bit
    assert graph_count() == before  # and nothing compiled while serving


def test_only_nodes_that_name_warm_up_batches_compile_and_refusals_say_why(monkeypatch, caplog):
    assert compile_nodes({"vocoder": _Codec()}, CPU, "stateless:0", False, lambda node: "none") == {}
    assert compile_nodes({"encoder": _Codec(warm=False)}, CPU, "stateless:0", True, lambda node: "none") == {}
    with pytest.raises(ValueError, match=r"stateless:0: node 'vocoder': compile: true, but it runs on CPU only"):
        compile_nodes({"vocoder": _Codec()}, torch.device("meta"), "stateless:0", True, lambda node: "none")
    with caplog.at_level(logging.INFO, logger="mstar.engine"):
        assert compile_nodes({"vocoder": _Codec()}, CPU, "stateless:0", "auto", lambda node: "fp16") == {}
    assert "node 'vocoder': forward eager (compile: auto, but it runs bf16 or weight-only" in caplog.text

    def fails(self, batches):
        raise ValueError(f"{self.name}: compiling the node's forward failed (Unsupported: a graph break)")

    monkeypatch.setattr(compiled_node.CompiledNode, "warm_up", fails)
    with caplog.at_level(logging.WARNING, logger="mstar.engine"):
        assert compile_nodes({"vocoder": _Codec()}, CPU, "stateless:0", "auto", lambda node: "none") == {}
    assert "node 'vocoder': forward eager (compile: auto; compiling the node's forward failed" in caplog.text
    with pytest.raises(ValueError, match=r"node 'vocoder': compiling the node's forward failed"):
        compile_nodes({"vocoder": _Codec()}, CPU, "stateless:0", True, lambda node: "none")


def test_a_compiling_stateless_engine_serves_its_batches_through_the_graphs():
    codec, store = _Codec(), InProcessTensorStore()
    engine = StatelessEngine({"vocoder": codec}, store, max_batch=4, compile=True)
    compiled = engine._compiled["vocoder"]
    batch_sizes: list[int] = []
    engine._compiled["vocoder"] = lambda **batch: batch_sizes.append(len(batch["codes"])) or compiled(**batch)
    outputs: list = []
    gen = torch.Generator().manual_seed(2)
    codes = [torch.randn(8, generator=gen) for _ in range(3)]
    for i, c in enumerate(codes):
        msg = ExecuteNode(call_id=i, request_id=f"r{i}", node="vocoder", inputs={"codes": store.put(c, owner=f"r{i}")})
        engine._handle(msg, outputs.append)
    before = graph_count()
    run_on_device(engine.step)
    assert batch_sizes == [3] and graph_count() == before
    got = [store.get(out.outputs["audio"]) for out in sorted(outputs, key=lambda out: out.call_id)]
    want = _served(codec, [{"codes": torch.stack(codes), "keep": (2, 12)}])[0]
    torch.testing.assert_close(torch.stack(got), want, rtol=1e-5, atol=1e-5)
