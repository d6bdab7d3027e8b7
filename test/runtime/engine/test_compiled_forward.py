"""The AR forward under torch.compile (``compile`` in the engine config): the same tokens as the eager
model, a graph with the attention as an op and one with a decode step's attention traced in, the
weights frozen into them (weight-only int8 / int4 too), packed linears of an eager engine as ops, no
compile while serving, and clear refusals where it cannot run."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import pytest
import torch

import mstar.engine.compile_support as compile_support
from mstar.conductor import Conductor
from mstar.engine.attention.backend import AttentionContext
from mstar.engine.attention.metadata import AttentionMetadata, SeqAttention
from mstar.engine.attention.torch_backend import TorchAttentionBackend
from mstar.engine.compile_support import compile_blocker
from mstar.engine.compiled_forward import CompiledForward
from mstar.engine.config import EngineConfig
from mstar.engine.core_builder import build_core
from mstar.engine.device_loop import run_on_device
from mstar.engine.kv_cache import KVSpec, PagedKVCache
from mstar.layers.linear_packing import PackedLinear, pack_linears, packed_count, packing_available
from mstar.layers.weight_only import WeightOnlyLinear, quantize_module
from mstar.sampling_params import SamplingParams
from mstar.transport.inprocess import InProcessTensorStore
from mstar_graphs.orpheus.frontend import OrpheusTTS
from mstar_graphs.orpheus.llama import LlamaForCausalLM
from mstar_ros.bench.quant_quality import _decode
from support.dense_kv_attention import DenseKVAttention
from support.parity import FP32
from support.toy_models import ToyLM

GREEDY = SamplingParams(max_tokens=21, seed=7)
TEXTS = ("The quick brown fox jumps over the lazy dog.", "Hello there!", "One, two, three, four, five.")
META = torch.device("meta")  # a non-CPU device every machine has
CPU = torch.device("cpu")


def _tiny_llm(dtype: torch.dtype) -> LlamaForCausalLM:
    tts = OrpheusTTS.load(progress=False)
    return LlamaForCausalLM.from_pretrained_dir(tts.paths.llm, dtype=dtype, progress=False).fuse_projections()


def _paged(module: torch.nn.Module, dtype: torch.dtype = torch.float32) -> TorchAttentionBackend:
    return TorchAttentionBackend(PagedKVCache(module.kv_spec(), num_blocks=16, block_size=4, dtype=dtype))


def _run(forward, backend: TorchAttentionBackend, ids: list[int], table: list[int], chunks: list[int]):
    """``ids`` through ``forward`` in steps of ``chunks`` tokens, as an engine plans them; each step's hidden."""
    hidden, done = [], 0
    with torch.inference_mode():
        for n in chunks:
            positions = list(range(done, done + n))
            slots = torch.tensor([table[p // 4] * 4 + p % 4 for p in positions])
            backend.plan(AttentionMetadata([SeqAttention(0, n, done + n, table)], slots))
            step = torch.tensor(ids[done : done + n]), torch.tensor(positions)
            hidden.append(forward(*step, AttentionContext(backend)))
            done += n
    return hidden


PROMPT = [128259, 40, 41, 42, 43, 44, 45, 128009, 128260, 50, 51, 52, 53]


async def _serve(tts: OrpheusTTS, config: EngineConfig) -> list[list[int]]:
    async with Conductor(tts.graph(), tts.modules(), config=config) as c:  # three answers batched together
        results = await asyncio.gather(*(c.submit(tts.request(t, sampling=GREEDY)).collect() for t in TEXTS))
    return [[int(t) for t in r["tokens"]] for r in results]


def test_the_compiled_engine_decodes_what_the_model_decodes_offline(caplog):
    tts = OrpheusTTS.load(progress=False)
    with caplog.at_level(logging.INFO, logger="mstar.engine"):
        served = asyncio.run(_serve(tts, msgspec.structs.replace(FP32, compile=True)))
    offline = LlamaForCausalLM.from_pretrained_dir(tts.paths.llm, dtype=torch.float32, progress=False)
    expected = [_decode(offline, tts.prompt_ids(t), GREEDY.max_tokens)[0] for t in TEXTS]
    assert served == expected
    messages = [r.getMessage() for r in caplog.records]
    assert any("forward compiled" in m for m in messages), messages
    assert any("node 'snac': forward compiled" in m for m in messages), messages  # its streaming windows too
    # prefills of three lengths, then decodes of 3, 2 and 1 rows: all served by the warm-up's graphs
    assert not any("new graph of the forward while serving" in m for m in messages), messages


def test_bf16_compiled_forward_runs_packed_linears_as_ops_and_stays_close_to_eager(monkeypatch):
    module = _tiny_llm(torch.bfloat16)
    packed = pack_linears(module, module.plain_linears)
    assert packed == (2 * 4 if packing_available() else 0)  # 2 layers x (q|k|v, o, gate|up, down)
    compiled = CompiledForward(module, "llm")
    compiled.warm_up(torch.device("cpu"))
    calls: list[int] = []
    eager_forward = PackedLinear.eager_forward
    monkeypatch.setattr(PackedLinear, "eager_forward", lambda self, x: calls.append(self.key) or eager_forward(self, x))
    ids, positions = torch.tensor([128259, 40, 41, 42, 43, 44, 45, 128009, 128260]), torch.arange(9)
    with torch.inference_mode():
        eager = module(ids, positions, DenseKVAttention(2))
        assert len(calls) == packed  # eager: each packed linear once
        got = compiled(ids, positions, DenseKVAttention(2))
    assert len(calls) == 2 * packed  # compiled: each once more, through mstar::packed_linear
    assert got.dtype == torch.bfloat16 and got.shape == eager.shape
    # inductor keeps fp32 between fused ops where eager rounds each to bf16: close, not equal
    scale = eager.float().abs().max()
    assert (got.float() - eager.float()).abs().max() <= 0.05 * scale


def test_a_compiling_engine_leaves_linears_to_inductor_and_decodes_as_eager():
    config = EngineConfig(num_kv_blocks=8, block_size=4, dtype="bfloat16", compile=True)
    core = build_core(_tiny_llm(torch.float32), InProcessTensorStore(), config, CPU, "llm", None)
    module = core.module
    assert packed_count(module) == 0  # inductor lays the weights out for the kernels it picks

    def both() -> tuple[torch.Tensor, torch.Tensor]:  # on the device thread, as serving calls it
        with torch.inference_mode():
            ids, positions = torch.tensor([128259, 40, 41, 42, 128009, 128260]), torch.arange(6)
            return core.runner.forward(ids, positions, DenseKVAttention(2)), module(ids, positions, DenseKVAttention(2))

    got, eager = run_on_device(both)
    assert core.runner.forward is not module and core.runner.forward.graphs == 3  # no compile while serving
    assert (got.float() - eager.float()).abs().max() <= 0.05 * eager.float().abs().max()


def _run_together(
    forward, backend: TorchAttentionBackend, prompts: list[list[int]], tables: list[list[int]], steps: int
):
    """The prompts prefilled in one step, then ``steps`` decode steps of one token each (the ids are the
    prompts' own, repeated), the last sequence dropping out for the last step; each step's hidden."""
    hidden, done = [], [0] * len(prompts)
    with torch.inference_mode():
        for step in range(steps + 1):
            live = range(len(prompts) - (step == steps and len(prompts) > 1))
            seqs, ids, positions, slots = [], [], [], []
            for s in live:
                n = len(prompts[s]) if step == 0 else 1
                seqs.append(SeqAttention(len(ids), n, done[s] + n, tables[s]))
                for p in range(done[s], done[s] + n):
                    ids.append(prompts[s][p % len(prompts[s])])
                    positions.append(p)
                    slots.append(tables[s][p // 4] * 4 + p % 4)
                done[s] += n
            backend.plan(AttentionMetadata(seqs, torch.tensor(slots)))
            hidden.append(forward(torch.tensor(ids), torch.tensor(positions), AttentionContext(backend)))
    return hidden


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_run_the_traced_graph_and_leave_the_cache_eager_would(dtype, monkeypatch):
    module = _tiny_llm(dtype)
    compiled, ours, theirs = CompiledForward(module, "llm"), _paged(module, dtype), _paged(module, dtype)
    compiled.warm_up(CPU, ours)
    assert compiled.graphs == 3 and compiled.decode_traced
    opaque_calls: list[int] = []  # the backend's own attention: prefills only
    backend_forward = TorchAttentionBackend.forward
    monkeypatch.setattr(
        TorchAttentionBackend,
        "forward",
        lambda self, layer, q, *rest: (
            (self is ours and opaque_calls.append(q.shape[0])) or backend_forward(self, layer, q, *rest)
        ),
    )
    # fp32: rounding apart; bf16: inductor keeps fp32 between fused ops where eager rounds each
    tolerance = 1e-5 if dtype == torch.float32 else 0.05

    def same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * float(b.abs().max()))
        for pool in ("k", "v"):
            a, b = getattr(ours.cache, pool), getattr(theirs.cache, pool)
            torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * float(b.abs().max()))

    table = [9, 2, 14, 5]  # scattered blocks: the cached keys are gathered
    chunks = [3] + [1] * 10  # a prefill (the opaque attention), then ten lone tokens of growing context
    same(_run(compiled, ours, PROMPT, table, chunks), _run(module, theirs, PROMPT, table, chunks))
    assert opaque_calls == [3, 3]  # the prefill's two layers; every lone token ran in the decode graph
    assert compiled.failed is None and compiled.decode_failed is None and compiled.eager_calls == 0

    # three sequences of three prompt lengths decode together, then two: rows and keys of any count
    prompts, tables = [PROMPT[:5], PROMPT[:2], PROMPT[:9]], [[0, 1, 3], [4, 6], [7, 8, 10, 11]]
    opaque_calls.clear()
    same(_run_together(compiled, ours, prompts, tables, 4), _run_together(module, theirs, prompts, tables, 4))
    assert opaque_calls == [16, 16]  # the prefill step only
    assert compiled.graphs == 3 and compiled.eager_calls == 0  # no compile while serving

    # a prompt of one token: its first step has no key before it and runs eager, the next ones traced
    same(_run(compiled, ours, PROMPT, [12, 13], [1, 1, 1]), _run(module, theirs, PROMPT, [12, 13], [1, 1, 1]))
    assert compiled.eager_calls == 1 and compiled.graphs == 3


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_weight_only_linears_compile_and_match_their_eager_forward(mode):
    module = _tiny_llm(torch.float32)
    assert quantize_module(module, mode) > 0
    compiled, ours, theirs = CompiledForward(module, "llm"), _paged(module), _paged(module)
    compiled.warm_up(CPU, ours)
    chunks = [9, 1, 1, 1]  # the many-token graph, then the decode-step one
    got = _run(compiled, ours, PROMPT, [3, 4, 5, 6], chunks)
    want = _run(module, theirs, PROMPT, [3, 4, 5, 6], chunks)
    for a, b in zip(got, want, strict=True):
        # the same int8 / int4 weights, summed in another order: fp32 rounding apart
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))
    assert compiled.eager_calls == 0 and compiled.graphs == 3 and compiled.decode_failed is None
    assert all(type(m) is not torch.nn.Linear or m is module.lm_head for m in module.modules())
    assert any(isinstance(m, WeightOnlyLinear) for m in module.modules())


class _UntraceableLM(ToyLM):
    def forward(self, input_ids, positions, attn, **extra):
        time.thread_time()  # a builtin dynamo cannot put in a graph
        return super().forward(input_ids, positions, attn, **extra)


def test_a_forward_that_is_not_one_graph_fails_at_start_or_runs_eager_under_auto(caplog):
    config = EngineConfig(num_kv_blocks=4, block_size=4, dtype="float32", compile=True)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"^llm: the module's forward cannot be compiled as one graph"):
        build_core(_UntraceableLM(), InProcessTensorStore(), config, cpu, "llm", None)
    with caplog.at_level(logging.WARNING, logger="mstar.engine.ar"):
        core = build_core(
            _UntraceableLM(), InProcessTensorStore(), msgspec.structs.replace(config, compile="auto"), cpu, "llm", None
        )
    assert core.runner.forward is core.module
    assert any("forward eager (compile: auto, but the module's forward" in r.getMessage() for r in caplog.records)


def test_compile_true_is_refused_where_it_cannot_run_and_auto_falls_back(monkeypatch, caplog):
    with pytest.raises(ValueError, match=r"compile = True .* quantization = 'int8_dynamic' is not supported"):
        EngineConfig(compile=True, quantization="int8_dynamic")
    assert EngineConfig(compile=True, quantization="int4").quantization == "int4"
    with pytest.raises(msgspec.ValidationError, match=r"\$\.compile"):
        msgspec.convert({"compile": "yes"}, EngineConfig)
    assert "CPU only" in compile_blocker(META, 1, "none")
    assert "tensor parallelism" in compile_blocker(torch.device("cpu"), 2, "none")
    assert "quantization 'fp16'" in compile_blocker(torch.device("cpu"), 1, "fp16")
    assert compile_blocker(torch.device("cpu"), 1, "int8") is None

    config = EngineConfig(num_kv_blocks=4, block_size=4, dtype="float32", compile=True)
    with pytest.raises(ValueError, match=r"llm: compile: true, but it runs on CPU only"):
        build_core(ToyLM(), InProcessTensorStore(), config, META, "llm", None)

    def no_compiler():
        raise RuntimeError("no g++")

    monkeypatch.setattr("torch._inductor.cpp_builder.get_cpp_compiler", no_compiler)
    assert "install g++" in compile_blocker(torch.device("cpu"), 1, "none")
    with pytest.raises(ValueError, match=r"llm: compile: true, but inductor needs a C\+\+ compiler"):
        build_core(ToyLM(), InProcessTensorStore(), config, torch.device("cpu"), "llm", None)
    auto = msgspec.structs.replace(config, compile="auto")
    with caplog.at_level(logging.INFO, logger="mstar.engine.ar"):
        core = build_core(ToyLM(), InProcessTensorStore(), auto, torch.device("cpu"), "llm", None)
    assert core.runner.forward is core.module  # eager, and said so
    assert any("forward eager (compile: auto, but inductor needs" in r.getMessage() for r in caplog.records)
    if packing_available():  # eager after all: its bf16 linears are packed as an eager engine's are
        bf16 = msgspec.structs.replace(auto, dtype="bfloat16")
        assert packed_count(build_core(_tiny_llm(torch.float32), InProcessTensorStore(), bf16, CPU, "llm", None).module)
    monkeypatch.undo()
    monkeypatch.setattr(compile_support.sysconfig, "get_paths", lambda: {"include": "/nonexistent"})
    assert "Python.h is missing (install python3-dev)" in compile_blocker(torch.device("cpu"), 1, "none")


class _KVOnly(torch.nn.Module):
    """A forward that drops its attention's output, as a KV-only last layer does: only its K/V matter."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 3 * 8)

    def forward(self, input_ids, positions, attn, **extra):
        x = torch.nn.functional.one_hot(input_ids % 8, 8).float() + positions[:, None]
        q, k, v = self.proj(x).view(-1, 3, 2, 4).unbind(1)
        attn(0, q, k, v, 0.5)  # writes K/V; its output is not used
        return x * 2


class _CountingAttention:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, layer, q, k, v, scale):
        self.calls.append(q.shape[0])
        return torch.zeros_like(q)


def test_the_attention_op_runs_when_its_output_is_unused_and_extra_inputs_run_eager():
    compiled = CompiledForward(_KVOnly(), "kv")
    compiled.warm_up(torch.device("cpu"))
    attn = _CountingAttention()
    ids = torch.tensor([1, 2, 3])
    with torch.inference_mode():
        out = compiled(ids, torch.arange(3), attn)
        assert attn.calls == [3]  # not removed as dead code: the K/V are written
        assert torch.equal(out, compiled.module(ids, torch.arange(3), _CountingAttention()))
        graphs = compiled.graphs
        compiled(ids, torch.arange(3), attn, row_kinds=torch.zeros(3, dtype=torch.long))
    assert attn.calls == [3, 3] and compiled.graphs == graphs  # extra inputs: the eager forward, no compile


class _TwiceAttending(_KVOnly):
    """Calls one layer's attention twice: the decode-step graph cannot say which K/V to store."""

    def forward(self, input_ids, positions, attn, **extra):
        x = super().forward(input_ids, positions, attn)
        q, k, v = self.proj(x / 2).view(-1, 3, 2, 4).unbind(1)
        return x + attn(0, q, k, v, 0.5).reshape(-1, 8)


def test_a_decode_graph_that_cannot_be_traced_leaves_decode_steps_to_the_other_graph(caplog):
    compiled = CompiledForward(_TwiceAttending(), "twice")
    backend = TorchAttentionBackend(PagedKVCache(KVSpec(1, 2, 4), num_blocks=4, block_size=4))
    with caplog.at_level(logging.WARNING, logger="mstar.engine"):
        compiled.warm_up(CPU, backend)
    assert not compiled.decode_traced and compiled.decode_failed  # dynamo reports the ValueError as unsupported
    assert "decode steps run as other steps" in caplog.text
    assert compiled.failed is None and compiled.graphs == 1  # the many-token graph still serves
    got = _run(compiled, backend, [1, 2, 3, 4], [0], [3, 1])
    want = _run(compiled.module, backend, [1, 2, 3, 4], [0], [3, 1])
    assert compiled.eager_calls == 1
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_compile_failure_while_serving_turns_the_forward_eager(caplog):
    compiled = CompiledForward(_KVOnly(), "kv")

    def broken(*args, **kwargs):
        raise torch._dynamo.exc.Unsupported("a recompile that cannot be one graph")

    compiled._compiled = broken
    attn = _CountingAttention()
    with caplog.at_level(logging.ERROR, logger="mstar.engine"), torch.inference_mode():
        out = compiled(torch.tensor([4, 5]), torch.arange(2), attn)
    assert attn.calls == [2] and out.shape == (2, 8)
    assert compiled.failed and "runs eager from now" in caplog.text
