"""An AR module's forward under ``torch.compile`` (``compile: true`` in the engine config, CPU only).

Why: on CPU a small model's decode step is mostly the cost of launching many small ops (norms, RoPE,
residual adds, casts: ~45 per layer), not of its matmuls. Inductor fuses them into a few generated
C++ kernels; the forward is then one graph.

Weights are frozen into the graphs (inductor's ``freezing``): they become constants, so inductor
lays each linear's weight out once for the kernel it picks, and picks it by measuring
(``max_autotune_gemm``): oneDNN's packed linear, its own AMX / AVX-512 GEMM templates, or aten's.
Weight-only int8 and int4 linears (``quantization: int8 | int4``) go through inductor's
weight-only GEMM templates the same way. The engine therefore leaves linears unpacked when it
compiles (``mstar.layers.linear_packing`` is for eager forwards); a linear packed by someone else
still runs, as the opaque op ``mstar::packed_linear``.

Attention: a lone query token (a decode step of one sequence) is traced into its own graph
(``mstar.engine.attention.lone_decode``): the cache tensors and the slots of the cached keys are its
inputs, the step's K/V its outputs, stored after it with one indexed write. Any other step's
attention (prefills, several sequences) stays an opaque op (``mstar::paged_attention``): the
backend's per-step plan (block tables, masks, batching) is Python state that changes every step;
the op calls the step's ``AttentionContext``, set around each call. That op writes the step's K/V:
it is registered as having a side effect, so a forward that drops its output (a KV-only last
layer) still runs it.

Graphs: one for a lone query token (any context length from ``MIN_TRACED_CONTEXT`` on) and one
for any number of tokens with the opaque attention, both compiled when the engine is built
(``warm_up``), so serving never waits for a compile. Each holds its own copy of the frozen weights
(memory: docs/performance.md). Only calls with token ids and positions alone are compiled: a call
with a module's extra inputs (pi0.5's image embeddings, BAGEL's row kinds), or a lone token with
fewer cached keys before it, runs the eager forward, on the module's own (unpacked) weights, as
do lone tokens of a module whose lone-token graph cannot be traced (logged at warm-up).
``fullgraph``: a forward that cannot be one graph fails at warm-up, naming the engine; should a
later compile fail while serving (a recompile, logged; its weights are not frozen), the forward
turns eager for good, logged as an error.
A module must not change its weights or buffers after the engine is built: the graphs may hold
copies of them.

Numerics: inductor keeps fp32 between the ops it fuses where eager rounds each op's bf16 output,
so bf16 results differ from the eager forward in the last bits (fp32 ones agree to ~1e-6).
"""

from __future__ import annotations

import logging
import sysconfig
import threading
import time
from pathlib import Path

import torch

from mstar.engine.attention.backend import AttentionBackend, AttentionContext
from mstar.engine.attention.lone_decode import LoneDecode, LoneDecodeAttention, store_step_kv
from mstar.engine.attention.metadata import AttentionMetadata, SeqAttention
from mstar.layers.weight_only import COMPILED_QUANTIZATIONS

log = logging.getLogger("mstar.engine")

_current = threading.local()  # the AttentionContext of the step being run on this thread


@torch.library.custom_op("mstar::paged_attention", mutates_args=())
def paged_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
    """The running step's attention for ``layer`` (writes the step's K/V into the paged cache)."""
    return _current.attn(layer, q, k, v, scale).contiguous()  # the layout the graph was compiled for


torch.fx.node.has_side_effect(torch.ops.mstar.paged_attention.default)  # never removed as unused


@paged_attention_op.register_fake
def _paged_attention_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
    return q.new_empty(q.shape)


def _opaque_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """What the compiled forward's layers call in place of the AttentionContext."""
    return paged_attention_op(q, k, v, layer, scale)


def _no_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Warm-up attention: the shapes of the real one, and no KV written."""
    return torch.zeros_like(q)


def _frozen_and_tuned():
    """Inductor settings of a warm-up compile: weights as constants, GEMM kernels chosen by measuring."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(
        freezing=True,
        max_autotune_gemm=True,
        autotune_num_choices_displayed=0,  # inductor prints every measurement to stderr otherwise
        max_autotune_report_choices_stats=False,
    )


def compile_blocker(device: torch.device, tp_size: int, quantization: str) -> str | None:
    """Why this engine's forward cannot be compiled here (None: it can)."""
    if device.type != "cpu":
        return f"it runs on CPU only (the engine's device is {device})"
    if tp_size > 1:
        return "it is not supported with tensor parallelism"
    if quantization not in COMPILED_QUANTIZATIONS:
        return f"it runs bf16 or weight-only int8 / int4 linears, not quantization {quantization!r}"
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # inductor found no compiler it can use
        return f"inductor needs a C++ compiler and found none ({type(exc).__name__}: {exc}; install g++)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():  # inductor builds its kernels as Python extensions
        return f"inductor builds Python extensions and {headers} is missing (install python3-dev)"
    return None


def _why(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# A lone token with fewer keys cached before it runs eager: the traced graph's key count is symbolic
# from 2 on (dynamo specialises sizes 0 and 1), and such steps are a prompt's first few tokens.
MIN_TRACED_CONTEXT = 2


def _warm_up_step(backend: AttentionBackend) -> LoneDecode | None:
    """The backend planned for a lone token with MIN_TRACED_CONTEXT keys cached before it (in the
    cache's first blocks: the warm-up reads them, writes nothing), as that step's LoneDecode."""
    cache = backend.cache
    context = MIN_TRACED_CONTEXT + 1
    pages = -(-context // cache.block_size)
    if pages > cache.num_blocks:
        return None
    slot = torch.tensor([context - 1], dtype=torch.int64, device=cache.device)
    backend.plan(AttentionMetadata([SeqAttention(0, 1, context, list(range(pages)))], slot))
    return backend.lone_decode()


# Each packed linear is a constant of its graph: another module of the same class (another engine) is
# another graph of the same code. Room for a few dozen before dynamo gives up on it.
RECOMPILE_LIMIT = 64


class CompiledForward:
    """Calls ``module.forward(input_ids, positions, attn, **extra)`` through its compiled graphs."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        self.name = name
        self.module = module
        self._compiled = torch.compile(module.forward, fullgraph=True)
        forward = module.forward

        def lone_token(
            input_ids: torch.Tensor,
            positions: torch.Tensor,
            k_cache: torch.Tensor,
            v_cache: torch.Tensor,
            cached_slots: torch.Tensor,
            compute_dtype: torch.dtype | None,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
            attn = LoneDecodeAttention(k_cache, v_cache, cached_slots, compute_dtype)
            return forward(input_ids, positions, attn), *attn.step_kv()

        self._lone = torch.compile(lone_token, fullgraph=True)
        self.lone_traced = False  # whether warm-up compiled the lone-token graph
        self.graphs = 0  # graphs compiled for this forward so far
        self.eager_calls = 0  # calls without extra inputs that ran the eager forward (short contexts)
        self.failed: str | None = None  # why it turned eager while serving
        self.lone_failed: str | None = None  # why lone tokens turned eager (at warm-up or while serving)
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext, **extra: torch.Tensor
    ) -> torch.Tensor:
        if extra or self.failed is not None:
            return self.module(input_ids, positions, attn, **extra)
        if input_ids.numel() == 1:
            traced = self.lone_traced and self.lone_failed is None and isinstance(attn, AttentionContext)
            lone = attn.lone_decode() if traced else None
            if lone is None or lone.cached_slots.numel() < MIN_TRACED_CONTEXT:
                self.eager_calls += 1
                return self.module(input_ids, positions, attn)
            return self._guarded(self._lone_token, input_ids, positions, attn, lone, lone_graph=True)
        _current.attn = attn
        try:
            return self._guarded(self._compiled, input_ids, positions, attn, _opaque_attention, lone_graph=False)
        finally:
            _current.attn = None

    def _lone_token(self, input_ids: torch.Tensor, positions: torch.Tensor, lone: LoneDecode) -> torch.Tensor:
        hidden, layers, keys, values = self._lone_graph(input_ids, positions, lone)
        store_step_kv(lone.cache, layers, lone.slot, keys, values)
        return hidden

    def _lone_graph(self, input_ids: torch.Tensor, positions: torch.Tensor, lone: LoneDecode):
        cache = lone.cache
        return self._lone(input_ids, positions, cache.k, cache.v, lone.cached_slots, lone.compute_dtype)

    def _guarded(
        self, graph, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext, arg, lone_graph: bool
    ) -> torch.Tensor:
        """``graph(input_ids, positions, arg)``; when compiling fails while serving, what that graph served
        (lone tokens, or every call) runs eager for good."""
        before = _graph_count()  # the process's count: a compile elsewhere meanwhile is counted too
        started = time.perf_counter()
        try:
            return graph(input_ids, positions, arg)
        except torch._dynamo.exc.TorchDynamoException as exc:
            why = _why(exc)
            if lone_graph:
                self.lone_failed = why
            else:
                self.failed = why
            log.error(
                "%s: compiling the forward failed while serving (%s); %s eager from now",
                self.name,
                why,
                "lone tokens run" if lone_graph else "it runs",
            )
            return self.module(input_ids, positions, attn)
        finally:
            new = _graph_count() - before
            if new:
                self.graphs += new
                log.warning(
                    "%s: compiled a new graph of the forward while serving (%d tokens): %.1f s",
                    self.name,
                    input_ids.numel(),
                    time.perf_counter() - started,
                )

    def warm_up(self, device: torch.device, backend: AttentionBackend | None = None) -> float:
        """Compiles the many-token graph, and the lone-token graph where ``backend`` can trace its
        attention; the seconds it took. Raises ValueError naming the engine when the forward cannot
        be compiled as one graph, or compiling failed; a lone-token graph that fails is logged, and
        lone tokens then run eager."""
        started = time.perf_counter()
        before = _graph_count()
        try:
            with torch.inference_mode(), _frozen_and_tuned():
                ids = torch.zeros(2, dtype=torch.long, device=device)
                positions = ids.clone()
                for tensor in (ids, positions):  # any number of tokens, in one graph
                    torch._dynamo.mark_dynamic(tensor, 0)
                _current.attn = _no_attention
                self._compiled(ids, positions, _opaque_attention)
        except Exception as exc:
            what = (
                "the module's forward cannot be compiled as one graph"
                if isinstance(exc, torch._dynamo.exc.Unsupported)
                else "compiling the module's forward failed"
            )
            raise ValueError(f"{self.name}: {what} ({_why(exc)}); set compile: false") from exc
        finally:
            _current.attn = None
        if backend is not None:
            self._warm_up_lone(device, backend)
        self.graphs += _graph_count() - before
        return time.perf_counter() - started

    def _warm_up_lone(self, device: torch.device, backend: AttentionBackend) -> None:
        try:
            with torch.inference_mode(), _frozen_and_tuned():
                lone = _warm_up_step(backend)
                if lone is None:
                    return
                torch._dynamo.mark_dynamic(lone.cached_slots, 0)  # any context length, in one graph
                for pool in (lone.cache.k, lone.cache.v):  # another engine's pool of another size: its own graph
                    torch._dynamo.mark_static(pool)
                ids = torch.zeros(1, dtype=torch.long, device=device)
                self._lone_graph(ids, ids.clone(), lone)  # stores nothing: the cache is unchanged
                self.lone_traced = True
        except Exception as exc:
            self.lone_failed = _why(exc)
            log.warning(
                "%s: a lone token's attention could not be traced into a graph (%s); lone tokens run eager",
                self.name,
                self.lone_failed,
            )
