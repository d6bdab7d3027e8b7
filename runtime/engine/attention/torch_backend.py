"""Paged attention with plain torch SDPA: the CPU backend, also correct (if slower) on CUDA."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mstar.engine.attention.backend import AttentionBackend
from mstar.engine.attention.decode_step import MIN_KEYS, DecodeStep, one_query_attention
from mstar.engine.attention.length_groups import similar_length_groups
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.dtype_choice import CpuProfile
from mstar.engine.kv_cache import PagedKVCache


@functools.cache
def amx_bf16() -> bool:
    """The CPU multiplies bf16 in AMX tiles and oneDNN may use them."""
    profile = CpuProfile.detect()
    isa = dict(profile.isa_limits).get("ONEDNN_MAX_CPU_ISA", "").upper()
    unlimited = isa in ("", "ALL", "DEFAULT") or "AMX" in isa
    return "amx_bf16" in profile.bf16_instructions and profile.onednn_bf16 and unlimited


def idle_scheduled() -> bool:
    """This process runs on the cycles others leave (Linux SCHED_IDLE: the edge box's batch group)."""
    return hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE


def cpu_score_dtype(kv_dtype: torch.dtype) -> torch.dtype:
    """The dtype a CPU computes attention in for a cache of ``kv_dtype``: a bf16 cache's own bf16 where
    the CPU has AMX (SDPA measured 2-6x faster than in fp32 with the casts there: a pi0.5-shaped
    800-token prefill 22.5 -> 3.6 ms), else fp32 (bf16 SDPA without native bf16 was 9x slower than
    fp32 on an AVX2-only CPU; fp16 is slower still on CPUs). An idle-scheduled process keeps fp32:
    BAGEL's AMX attention in the edge box's idle group slowed the box's control chunks (bench mixed:
    control p95 x1.34 and x1.42 with it, x1.02 without)."""
    if kv_dtype == torch.bfloat16 and amx_bf16() and not idle_scheduled():
        return torch.bfloat16
    return torch.float32


def key_slots(seq: SeqAttention, block_size: int, length: int | None = None) -> torch.Tensor:
    """Flat cache slots of the sequence's cached tokens ``[0, context_len)`` (int64, CPU).

    With ``length`` > context_len the tail repeats the last slot (padding that is masked out
    but still reads finite, real values).
    """
    n = seq.context_len if length is None else length
    j = torch.arange(n, dtype=torch.int64).clamp_(max=seq.context_len - 1)
    blocks = torch.tensor(seq.block_table, dtype=torch.int64)
    return blocks[j // block_size] * block_size + j % block_size


def batch_key_slots(
    seqs: list[SeqAttention], block_size: int, length: int, newest_excluded: bool = False
) -> torch.Tensor:
    """``key_slots(s, block_size, length)`` of every sequence, concatenated ([len(seqs) * length]), with a
    few tensor ops for the whole batch instead of several per sequence. ``newest_excluded``: the keys
    cached before each sequence's newest token (padding repeats the one before it)."""
    pages = -(-length // block_size)
    tables = [s.block_table[:pages] for s in seqs]
    table = torch.tensor([t + [0] * (pages - len(t)) for t in tables], dtype=torch.int64)  # padding never read
    last = torch.tensor([s.context_len - 1 - newest_excluded for s in seqs], dtype=torch.int64)
    j = torch.arange(length, dtype=torch.int64).expand(len(seqs), -1).minimum(last[:, None])
    return (table.gather(1, j // block_size) * block_size + j % block_size).reshape(-1)


def build_mask(seq: SeqAttention) -> torch.Tensor:
    """[query_len, context_len] bool, True where the query may attend (absolute positions)."""
    first = seq.first_position
    q_pos = first + seq.context_len - seq.query_len + torch.arange(seq.query_len)
    k_pos = first + torch.arange(seq.context_len)
    qp, kp = q_pos[:, None], k_pos[None, :]
    if seq.mask == MaskKind.CAUSAL:
        mask = kp <= qp
    elif seq.mask == MaskKind.PREFIX_BIDIRECTIONAL:
        a = seq.mask_arg
        mask = (kp <= qp) | ((kp < a) & (qp < a))
    elif seq.mask == MaskKind.BLOCK_CAUSAL:
        a = seq.mask_arg
        mask = (kp // a) <= (qp // a)
    else:
        raise ValueError(f"unknown mask kind {seq.mask!r}")
    for start, end in seq.spans:  # rows of one bidirectional span see each other
        mask |= (qp >= start) & (qp < end) & (kp >= start) & (kp < end)
    return mask


def validate_seq(seq: SeqAttention, block_size: int) -> None:
    if seq.query_len < 0 or seq.context_len < seq.query_len:
        raise ValueError(f"sequence needs 0 <= query_len <= context_len, got {seq.query_len}, {seq.context_len}")
    if seq.context_len > len(seq.block_table) * block_size:
        raise ValueError(
            f"context_len {seq.context_len} exceeds the {len(seq.block_table)} blocks "
            f"x {block_size} slots of its block table"
        )
    if seq.mask == MaskKind.BLOCK_CAUSAL and seq.mask_arg <= 0:
        raise ValueError(f"BLOCK_CAUSAL needs mask_arg (frame size) > 0, got {seq.mask_arg}")


@dataclass
class _DecodePlan:
    """query_len == 1 sequences of similar context length, batched into one padded SDPA call."""

    rows: torch.Tensor | None  # [B] packed rows of the queries; None when they are rows [r0, r0 + B)
    row0: int
    batch: int
    max_len: int
    slots: torch.Tensor | None  # [B * max_len] flat key slots (padding repeats a real slot); None: key_start
    key_mask: torch.Tensor | None  # [B, 1, 1, max_len] bool, None when every sequence has max_len keys
    key_start: int | None = None  # one sequence whose keys are the slots [key_start, key_start + max_len)


@dataclass
class _PrefillPlan:
    """One sequence with query_len > 1: its own SDPA with an explicit mask."""

    start: int
    length: int
    slots: torch.Tensor  # [context_len]
    mask: torch.Tensor | None  # [query_len, context_len] bool; None with is_causal or no masking
    is_causal: bool


@dataclass
class _GroupPlan:
    """Several sequences with the same query_len > 1 and similar context lengths (e.g. the flow
    suffixes of many robots), batched into one padded SDPA call with a per-sequence mask."""

    starts: torch.Tensor  # [B] first packed row of each sequence
    length: int  # query_len of each
    max_len: int
    slots: torch.Tensor  # [B * max_len]
    mask: torch.Tensor | None  # [B, 1, length, max_len] bool, or [B, 1, 1, max_len] when every query
    # row sees the same keys (padding only); None when it sees them all
    rows_alike: bool  # the mask is the same for every query row (see heads_as_rows)


def _group(plans: list[_PrefillPlan], seqs: list[SeqAttention], bs: int, dev: torch.device) -> _GroupPlan:
    max_len = max(s.context_len for s in seqs)
    mask = torch.zeros(len(seqs), 1, seqs[0].query_len, max_len, dtype=torch.bool)
    for i, s in enumerate(seqs):
        mask[i, 0, :, : s.context_len] = build_mask(s)
    slots = torch.cat([key_slots(s, bs, max_len) for s in seqs]).to(dev)
    starts = torch.tensor([p.start for p in plans], dtype=torch.int64)
    rows_alike = bool((mask == mask[:, :, :1]).all())
    if rows_alike:
        mask = None if bool(mask.all()) else mask[:, :, :1]
    return _GroupPlan(starts, seqs[0].query_len, max_len, slots, None if mask is None else mask.to(dev), rows_alike)


def contiguous_key_start(seq: SeqAttention, block_size: int) -> int | None:
    """The first key slot when the sequence's keys fill consecutive slots (its blocks follow each other,
    as a lone request's blocks usually do), else None."""
    pages = -(-seq.context_len // block_size)
    blocks = seq.block_table[:pages]
    first = blocks[0]
    return first * block_size if blocks == list(range(first, first + pages)) else None


def _decode_plan(decode: list[SeqAttention], bs: int, dev: torch.device) -> _DecodePlan:
    lens = [s.context_len for s in decode]
    max_len = max(lens)
    if len(decode) == 1:  # keys in consecutive slots are read as a slice of the cache, not gathered per layer
        start = contiguous_key_start(decode[0], bs)
        if start is not None:
            return _DecodePlan(None, decode[0].query_start, 1, max_len, None, None, key_start=start)
    slots = batch_key_slots(decode, bs, max_len).to(dev)
    key_mask = None
    if min(lens) != max_len:
        key_mask = (
            (torch.arange(max_len)[None, :] < torch.tensor(lens)[:, None]).view(len(decode), 1, 1, max_len).to(dev)
        )
    starts = [s.query_start for s in decode]
    in_order = starts == list(range(starts[0], starts[0] + len(starts)))
    rows = None if in_order else torch.tensor(starts, dtype=torch.int64, device=dev)
    return _DecodePlan(rows, starts[0], len(decode), max_len, slots, key_mask)


def heads_as_rows(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, L, Hq, D] -> [B, Hkv, G * L, D]: the G query heads sharing a KV head become G x L
    query rows of that head. Exact when every row sees the same keys (no causal mask), and
    faster on CPU than SDPA's own GQA broadcast (measured at 542 rows, 8:1 heads: 5.2 -> 4.2 ms)."""
    B, L, Hq, D = q.shape
    return q.view(B, L, kv_heads, Hq // kv_heads, D).permute(0, 2, 3, 1, 4).reshape(B, kv_heads, Hq // kv_heads * L, D)


def rows_as_heads(o: torch.Tensor, length: int) -> torch.Tensor:
    """The inverse of :func:`heads_as_rows`: [B, Hkv, G * L, D] -> [B, L, Hq, D]."""
    B, Hkv, GL, D = o.shape
    return o.view(B, Hkv, GL // length, length, D).permute(0, 3, 1, 2, 4).reshape(B, length, GL // length * Hkv, D)


class TorchAttentionBackend(AttentionBackend):
    """Gathers each sequence's keys from the paged cache and runs torch SDPA.

    A single query that is the newest token sees every cached key under all three mask
    kinds, so decode sequences share one padded call whatever their masks.
    """

    name = "torch"

    def __init__(self, cache: PagedKVCache, compute_dtype: torch.dtype | None = None) -> None:
        """``compute_dtype``: what scores are computed in (None: the cache's dtype on CUDA, on a CPU
        :func:`cpu_score_dtype`)."""
        super().__init__(cache)
        if compute_dtype is None and cache.device.type == "cpu":
            compute_dtype = cpu_score_dtype(cache.dtype)
        self.compute_dtype = compute_dtype
        self._meta: AttentionMetadata | None = None
        self._decodes: list[_DecodePlan] = []
        self._prefills: list[_PrefillPlan] = []
        self._groups: list[_GroupPlan] = []
        self._all_decode_in_order = False
        self._decode_only: list[SeqAttention] | None = None  # a decode step's sequences, rows in order

    def plan(self, meta: AttentionMetadata) -> None:
        bs, dev = self.cache.block_size, self.cache.device
        total = 0
        decode: list[SeqAttention] = []
        prefills: list[_PrefillPlan] = []
        by_len: dict[int, list[tuple[_PrefillPlan, SeqAttention]]] = {}
        for s in meta.seqs:
            validate_seq(s, bs)
            total += s.query_len
            if s.query_len == 0:
                continue
            if s.query_len == 1:
                decode.append(s)
                continue
            mask: torch.Tensor | None = build_mask(s)
            causal = False
            if bool(mask.all()):
                mask = None
            elif s.mask == MaskKind.CAUSAL and not s.spans and s.query_len == s.context_len:
                mask, causal = None, True  # SDPA's top-left causal equals ours when Lq == Lk
            plan = _PrefillPlan(
                s.query_start, s.query_len, key_slots(s, bs).to(dev), None if mask is None else mask.to(dev), causal
            )
            prefills.append(plan)
            by_len.setdefault(s.query_len, []).append((plan, s))
        if total != meta.num_tokens:
            raise ValueError(f"sequences cover {total} query tokens but slot_mapping has {meta.num_tokens}")

        # Only sequences of similar context length share a padded call (see length_groups).
        self._decodes = [
            _decode_plan([decode[i] for i in g], bs, dev)
            for g in similar_length_groups([s.context_len for s in decode], query_len=1)
        ]
        self._groups = []
        for members in by_len.values():
            if len(members) == 1:
                continue
            for g in similar_length_groups([m[1].context_len for m in members], members[0][1].query_len):
                if len(g) > 1:  # one call for all of them instead of one per sequence
                    self._groups.append(_group([members[i][0] for i in g], [members[i][1] for i in g], bs, dev))
                    grouped = {id(members[i][0]) for i in g}
                    prefills = [p for p in prefills if id(p) not in grouped]
        self._prefills = prefills
        only = self._decodes[0] if len(self._decodes) == 1 else None
        self._all_decode_in_order = (
            not prefills
            and not self._groups
            and only is not None
            and only.rows is None
            and only.row0 == 0
            and only.batch == meta.num_tokens
        )
        in_order = [s.query_start for s in decode] == list(range(len(decode)))
        only_decodes = bool(decode) and len(decode) == meta.num_tokens  # no prefill, grouped or not
        self._decode_only = decode if only_decodes and in_order else None
        self._meta = meta

    def decode_step(self) -> DecodeStep | None:
        meta, seqs = self._meta, self._decode_only
        if meta is None or seqs is None or min(s.context_len for s in seqs) < 2:
            return None  # a token with no key before it: nothing to pad its row's keys with
        rows = len(seqs)
        cached = torch.tensor([s.context_len - 1 for s in seqs])
        width = max(int(cached.max()), MIN_KEYS)
        slots = batch_key_slots(seqs, self.cache.block_size, width, newest_excluded=True).view(rows, width)
        mask = torch.arange(width + 1)[None, :] < cached[:, None]
        mask[:, width] = True  # the row's own key
        dev = self.cache.device
        mask = mask.view(rows, 1, 1, width + 1).to(dev)
        return DecodeStep(self.cache, slots.to(dev), mask, meta.slot_mapping, self.compute_dtype)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        meta = self._meta
        if meta is None:
            raise RuntimeError("TorchAttentionBackend.forward called before plan()")
        T, Hq, D = q.shape
        if meta.num_tokens != T:
            raise ValueError(f"forward got {T} query tokens, plan() was for {meta.num_tokens}")
        Hkv = self.cache.spec.num_kv_heads
        if Hq % Hkv:
            raise ValueError(f"{Hq} query heads is not a multiple of {Hkv} KV heads")
        self.cache.write(layer, meta.slot_mapping, k, v)
        kc = self.cache.k[layer].view(-1, Hkv, D)
        vc = self.cache.v[layer].view(-1, Hkv, D)
        cdt = self.compute_dtype or q.dtype

        if self._all_decode_in_order:
            return self._decode_attn(self._decodes[0], q, kc, vc, scale, cdt)
        out = torch.empty_like(q)
        for dec in self._decodes:
            qd = q[dec.row0 : dec.row0 + dec.batch] if dec.rows is None else q.index_select(0, dec.rows)
            od = self._decode_attn(dec, qd, kc, vc, scale, cdt)
            if dec.rows is None:
                out[dec.row0 : dec.row0 + dec.batch] = od
            else:
                out.index_copy_(0, dec.rows, od)
        G = Hq // Hkv
        for g in self._groups:
            B = g.starts.numel()
            rows = (g.starts[:, None] + torch.arange(g.length)[None, :]).reshape(-1).to(q.device)
            ks = kc.index_select(0, g.slots).to(cdt).view(B, g.max_len, Hkv, D).transpose(1, 2)
            vs = vc.index_select(0, g.slots).to(cdt).view(B, g.max_len, Hkv, D).transpose(1, 2)
            qg = q.index_select(0, rows).to(cdt).view(B, g.length, Hq, D)
            if g.rows_alike and G > 1:
                o = F.scaled_dot_product_attention(heads_as_rows(qg, Hkv), ks, vs, attn_mask=g.mask, scale=scale)
                o = rows_as_heads(o, g.length)
            else:
                o = F.scaled_dot_product_attention(
                    qg.transpose(1, 2), ks, vs, attn_mask=g.mask, scale=scale, enable_gqa=G > 1
                ).transpose(1, 2)
            out.index_copy_(0, rows, o.reshape(B * g.length, Hq, D).to(out.dtype))
        for p in self._prefills:
            # 4-D (batch of one): with 3-D inputs SDPA on CPU falls back to its math path (bmm +
            # softmax, K/V repeated for GQA), measured 2-3x slower than the flash kernel at 547 rows.
            ks = kc.index_select(0, p.slots).to(cdt).transpose(0, 1)[None]  # [1, Hkv, ctx, D]
            vs = vc.index_select(0, p.slots).to(cdt).transpose(0, 1)[None]
            qp = q[p.start : p.start + p.length].to(cdt)[None]  # [1, ql, Hq, D]
            if p.mask is None and not p.is_causal and G > 1:
                o = rows_as_heads(F.scaled_dot_product_attention(heads_as_rows(qp, Hkv), ks, vs, scale=scale), p.length)
            else:
                o = F.scaled_dot_product_attention(
                    qp.transpose(1, 2), ks, vs, attn_mask=p.mask, is_causal=p.is_causal, scale=scale, enable_gqa=G > 1
                ).transpose(1, 2)
            out[p.start : p.start + p.length] = o[0]
        return out

    @staticmethod
    def _decode_attn(
        dec: _DecodePlan, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, scale: float, cdt: torch.dtype
    ) -> torch.Tensor:
        B, _, D = q.shape
        Hkv = kc.shape[1]
        if dec.slots is None:  # the same keys as gathering their slots, read in place
            ks = kc[dec.key_start : dec.key_start + dec.max_len]
            vs = vc[dec.key_start : dec.key_start + dec.max_len]
        else:
            ks, vs = kc.index_select(0, dec.slots), vc.index_select(0, dec.slots)
        shape = (B, dec.max_len, Hkv, D)
        return one_query_attention(q, ks.view(shape), vs.view(shape), scale, cdt, dec.key_mask)
