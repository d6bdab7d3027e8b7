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

Attention: a decode step (one query token of each sequence, any number of sequences) is traced into
its own graph (``mstar.engine.attention.decode_step``): the cache tensors, the slots of each row's
cached keys and their padding mask are its inputs, the step's K/V its outputs, stored after it with
one indexed write for all layers. Any other step's attention (prefills, a prefill beside decodes)
stays an opaque op (``mstar::paged_attention``): the backend's per-step plan (block tables, masks,
batching) is Python state that changes every step; the op calls the step's ``AttentionContext``,
set around each call. That op writes the step's K/V: it is registered as having a side effect, so
a forward that drops its output (a KV-only last layer) still runs it.

Graphs: two for decode steps (one row; any number of rows from 2 on; any number of keys in both) and
one for any number of tokens with the opaque attention, all compiled when the engine is built
(``warm_up``), so serving never waits for a compile. Each holds its own copy of the frozen weights
(memory: docs/performance.md). Only calls with token ids and positions alone are compiled: a
call with a module's extra inputs (pi0.5's image embeddings, BAGEL's row kinds), or a lone token with
no key before it, runs the eager forward, on the module's own (unpacked) weights; so do a module's
lone tokens when its decode graph cannot be traced (logged at warm-up; steps of several tokens then
take the opaque graph).
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
import threading
import time

import torch

from mstar.engine.attention.backend import AttentionBackend, AttentionContext
from mstar.engine.attention.decode_step import MIN_KEYS, DecodeStep, DecodeStepAttention, store_step_kv
from mstar.engine.attention.metadata import AttentionMetadata, SeqAttention
from mstar.engine.compile_support import RECOMPILE_LIMIT, frozen_and_tuned, graph_count, one_line

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


def _warm_up_steps(backend: AttentionBackend) -> list[DecodeStep]:
    """The backend planned for decode steps of one sequence, then of two, with 3 and 2 keys cached (in
    the cache's first blocks: the warm-up reads them, writes nothing), as their DecodeSteps: key columns
    3 and mask columns 4 in both, rows 2 in the second, sizes that differ, so dynamo gives each its own
    symbol. Empty where the cache is too small."""
    cache = backend.cache
    seqs, slots, block = [], [], 0
    for row, context in enumerate((MIN_KEYS + 2, MIN_KEYS + 1)):
        pages = -(-context // cache.block_size)
        table = list(range(block, block + pages))
        block += pages
        seqs.append(SeqAttention(row, 1, context, table))
        slots.append(table[-1] * cache.block_size + (context - 1) % cache.block_size)
    if block > cache.num_blocks:
        return []
    steps = []
    for rows in (1, 2):
        backend.plan(AttentionMetadata(seqs[:rows], torch.tensor(slots[:rows], dtype=torch.int64, device=cache.device)))
        steps.append(backend.decode_step())
    return [step for step in steps if step is not None]


class CompiledForward:
    """Calls ``module.forward(input_ids, positions, attn, **extra)`` through its compiled graphs."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        self.name = name
        self.module = module
        self._compiled = torch.compile(module.forward, fullgraph=True)
        forward = module.forward

        def decode_step(
            input_ids: torch.Tensor,
            positions: torch.Tensor,
            k_cache: torch.Tensor,
            v_cache: torch.Tensor,
            cached_slots: torch.Tensor,
            key_mask: torch.Tensor,
            compute_dtype: torch.dtype | None,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
            attn = DecodeStepAttention(k_cache, v_cache, cached_slots, key_mask, compute_dtype)
            return forward(input_ids, positions, attn), *attn.step_kv()

        self._decode = torch.compile(decode_step, fullgraph=True)
        self.decode_traced = False  # whether warm-up compiled the decode-step graph
        self.graphs = 0  # graphs compiled for this forward so far
        self.eager_calls = 0  # calls without extra inputs that ran the eager forward (a token with no key before it)
        self.failed: str | None = None  # why it turned eager while serving
        self.decode_failed: str | None = None  # why decode steps left their graph (at warm-up or while serving)
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext, **extra: torch.Tensor
    ) -> torch.Tensor:
        if extra or self.failed is not None:
            return self.module(input_ids, positions, attn, **extra)
        traced = self.decode_traced and self.decode_failed is None and isinstance(attn, AttentionContext)
        step = attn.decode_step() if traced else None
        if step is not None:
            return self._guarded(self._decode_step, input_ids, positions, attn, step, decode_graph=True)
        if input_ids.numel() == 1:  # the many-token graph's token count is symbolic from 2 on
            self.eager_calls += 1
            return self.module(input_ids, positions, attn)
        _current.attn = attn
        try:
            return self._guarded(self._compiled, input_ids, positions, attn, _opaque_attention, decode_graph=False)
        finally:
            _current.attn = None

    def _decode_step(self, input_ids: torch.Tensor, positions: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        hidden, layers, keys, values = self._decode_graph(input_ids, positions, step)
        store_step_kv(step, layers, keys, values)
        return hidden

    def _decode_graph(self, input_ids: torch.Tensor, positions: torch.Tensor, step: DecodeStep):
        cache = step.cache
        return self._decode(
            input_ids, positions, cache.k, cache.v, step.cached_slots, step.key_mask, step.compute_dtype
        )

    def _guarded(
        self, graph, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext, arg, decode_graph: bool
    ) -> torch.Tensor:
        """``graph(input_ids, positions, arg)``; when compiling fails while serving, what that graph served
        (decode steps, or every call) runs eager for good."""
        before = graph_count()  # the process's count: a compile elsewhere meanwhile is counted too
        started = time.perf_counter()
        try:
            return graph(input_ids, positions, arg)
        except torch._dynamo.exc.TorchDynamoException as exc:
            why = one_line(exc)
            if decode_graph:
                self.decode_failed = why
            else:
                self.failed = why
            log.error(
                "%s: compiling the forward failed while serving (%s); %s eager from now",
                self.name,
                why,
                "decode steps run" if decode_graph else "it runs",
            )
            return self.module(input_ids, positions, attn)
        finally:
            new = graph_count() - before
            if new:
                self.graphs += new
                log.warning(
                    "%s: compiled a new graph of the forward while serving (%d tokens): %.1f s",
                    self.name,
                    input_ids.numel(),
                    time.perf_counter() - started,
                )

    def warm_up(self, device: torch.device, backend: AttentionBackend | None = None) -> float:
        """Compiles the many-token graph, and the decode-step graph where ``backend`` can trace its
        attention; the seconds it took. Raises ValueError naming the engine when the forward cannot
        be compiled as one graph, or compiling failed; a decode-step graph that fails is logged, and
        decode steps then take the many-token graph (a lone token: the eager forward)."""
        started = time.perf_counter()
        before = graph_count()
        try:
            with torch.inference_mode(), frozen_and_tuned():
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
            raise ValueError(f"{self.name}: {what} ({one_line(exc)}); set compile: false") from exc
        finally:
            _current.attn = None
        if backend is not None:
            self._warm_up_decode(device, backend)
        self.graphs += graph_count() - before
        return time.perf_counter() - started

    def _warm_up_decode(self, device: torch.device, backend: AttentionBackend) -> None:
        try:
            with torch.inference_mode(), frozen_and_tuned():
                steps = _warm_up_steps(backend)
                if not steps:
                    return
                for step in steps:  # one row, then any number from 2 on
                    rows = step.cached_slots.shape[0]
                    ids = torch.zeros(rows, dtype=torch.long, device=device)
                    positions = ids.clone()
                    dynamic = [(step.cached_slots, 1), (step.key_mask, 3)]  # any number of keys
                    if rows > 1:
                        dynamic += [(ids, 0), (positions, 0), (step.cached_slots, 0), (step.key_mask, 0)]
                    for tensor, dim in dynamic:
                        torch._dynamo.mark_dynamic(tensor, dim)
                    for pool in (step.cache.k, step.cache.v):  # another engine's pool of another size: its own graph
                        torch._dynamo.mark_static(pool)
                    self._decode_graph(ids, positions, step)  # stores nothing: the cache is unchanged
                self.decode_traced = True
        except Exception as exc:
            self.decode_failed = one_line(exc)
            log.warning(
                "%s: a decode step's attention could not be traced into a graph (%s); decode steps run as other steps",
                self.name,
                self.decode_failed,
            )
