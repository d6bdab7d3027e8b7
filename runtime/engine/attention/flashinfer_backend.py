"""Paged attention with FlashInfer (CUDA only; flashinfer-python 0.6.x, imported lazily).

Pure-decode steps use ``BatchDecodeWithPagedKVCacheWrapper`` (tensor-core path, which takes
any GQA group size); any step with a prefill chunk uses one
``BatchPrefillWithPagedKVCacheWrapper`` call for the whole packed batch. FlashInfer's causal
mask is bottom-right aligned (query i of a chunk sees kv j <= i + kv_len - qo_len), which is
our CAUSAL for chunked prefill too. PREFIX_BIDIRECTIONAL / BLOCK_CAUSAL and bidirectional spans go through
``custom_mask`` (every sequence's [qo_len, kv_len] boolean mask, flattened and concatenated),
built once per step. A single newest-token query sees every cached key under all three
kinds, so decode steps never need a mask.

``sm_scale``, ``num_qo_heads`` and the q dtype are plan() arguments in FlashInfer but only
reach us in ``forward``, so the wrapper is planned on the step's first layer and re-planned
only if one of them changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mstar.engine.attention.backend import AttentionBackend
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind
from mstar.engine.attention.torch_backend import build_mask, validate_seq
from mstar.engine.kv_cache import PagedKVCache

_SUPPORTED_KV_DTYPES = (torch.float16, torch.bfloat16)
_SUPPORTED_HEAD_DIMS = (64, 128, 256)  # other sizes are not validated by the FA2 kernels (illegal accesses)


@dataclass
class _StepPlan:
    decode_only: bool
    qo_indptr: torch.Tensor  # [B + 1] int32
    kv_indptr: torch.Tensor  # [B + 1] int32 (pages)
    kv_indices: torch.Tensor  # [kv_indptr[-1]] int32
    kv_last_page_len: torch.Tensor  # [B] int32, in [1, page_size]
    custom_mask: torch.Tensor | None  # flattened bool, or None for causal
    perm: torch.Tensor | None  # packed rows in FlashInfer order; None when already in order


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, cache: PagedKVCache, workspace_bytes: int = 128 * 1024 * 1024) -> None:
        super().__init__(cache)
        if cache.device.type != "cuda":
            raise RuntimeError(f"FlashInfer attention needs a CUDA KV cache, got device {cache.device}")
        if cache.dtype not in _SUPPORTED_KV_DTYPES:
            raise RuntimeError(f"FlashInfer attention needs a float16/bfloat16 KV cache, got {cache.dtype}")
        import flashinfer  # lazy: optional, CUDA-only dependency

        # One float workspace serves both wrappers: a step runs only one of them.
        self._workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=cache.device)
        # fa2, not "auto": auto fixes its kernel family at the first plan() (fa3 on Hopper for a causal
        # step), and the fa3 paged kernel ignores custom masks that later steps need
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, kv_layout="NHD", backend="fa2")
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, kv_layout="NHD", use_tensor_cores=True
        )
        self._meta: AttentionMetadata | None = None
        self._step: _StepPlan | None = None
        self._planned_key: tuple[Any, ...] | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        bs, dev = self.cache.block_size, self.cache.device
        seqs = sorted((s for s in meta.seqs if s.query_len > 0), key=lambda s: s.query_start)
        qo, kv_ptr, indices, last, masks, rows = [0], [0], [], [], [], []
        need_custom = False
        for s in seqs:
            validate_seq(s, bs)
            pages = -(-s.context_len // bs)
            indices.extend(s.block_table[:pages])
            qo.append(qo[-1] + s.query_len)
            kv_ptr.append(kv_ptr[-1] + pages)
            last.append(s.context_len - (pages - 1) * bs)
            rows.append(torch.arange(s.query_start, s.query_start + s.query_len))
            m = build_mask(s) if s.query_len > 1 else torch.ones(1, s.context_len, dtype=torch.bool)
            masks.append(m)
            if (s.mask != MaskKind.CAUSAL or s.spans) and s.query_len > 1:
                causal = torch.ones_like(m).tril(diagonal=s.context_len - s.query_len)
                need_custom |= not torch.equal(m, causal)
        if qo[-1] != meta.num_tokens:
            raise ValueError(f"sequences cover {qo[-1]} query tokens but slot_mapping has {meta.num_tokens}")
        order = torch.cat(rows) if rows else torch.empty(0, dtype=torch.int64)
        in_order = torch.equal(order, torch.arange(meta.num_tokens))

        def i32(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int32, device=dev)

        self._step = _StepPlan(
            decode_only=all(s.query_len == 1 for s in seqs),
            qo_indptr=i32(qo),
            kv_indptr=i32(kv_ptr),
            kv_indices=i32(indices),
            kv_last_page_len=i32(last),
            custom_mask=torch.cat([m.flatten() for m in masks]).to(dev) if need_custom else None,
            perm=None if in_order else order.to(dev),
        )
        self._meta = meta
        self._planned_key = None

    def _plan_wrapper(self, num_qo_heads: int, head_dim: int, scale: float) -> None:
        st, spec = self._step, self.cache.spec
        assert st is not None
        common = dict(q_data_type=self.cache.dtype, kv_data_type=self.cache.dtype, sm_scale=scale)
        if st.decode_only:
            self._decode.plan(
                st.kv_indptr,
                st.kv_indices,
                st.kv_last_page_len,
                num_qo_heads,
                spec.num_kv_heads,
                head_dim,
                self.cache.block_size,
                **common,
            )
        else:
            self._prefill.plan(
                st.qo_indptr,
                st.kv_indptr,
                st.kv_indices,
                st.kv_last_page_len,
                num_qo_heads,
                spec.num_kv_heads,
                head_dim,
                self.cache.block_size,
                custom_mask=st.custom_mask,
                causal=st.custom_mask is None,
                **common,
            )

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        meta, st = self._meta, self._step
        if meta is None or st is None:
            raise RuntimeError("FlashInferAttentionBackend.forward called before plan()")
        if q.shape[0] != meta.num_tokens:
            raise ValueError(f"forward got {q.shape[0]} query tokens, plan() was for {meta.num_tokens}")
        self.cache.write(layer, meta.slot_mapping, k, v)
        if q.shape[0] == 0:
            return torch.empty_like(q)
        key = (q.shape[1], q.shape[2], float(scale))
        if key != self._planned_key:
            self._plan_wrapper(q.shape[1], q.shape[2], float(scale))
            self._planned_key = key
        qq = q if st.perm is None else q.index_select(0, st.perm)
        qq = qq.to(self.cache.dtype).contiguous()
        kv = (self.cache.k[layer], self.cache.v[layer])  # [pages, page_size, Hkv, D] = NHD
        o = (self._decode if st.decode_only else self._prefill).run(qq, kv)
        if st.perm is not None:
            o = torch.empty_like(o).index_copy_(0, st.perm, o)
        return o.to(q.dtype)
