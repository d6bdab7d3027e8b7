"""The Thinker sharded for tensor parallelism (Megatron-style), after its experts are fused.

- Attention: q / k / v column-parallel by whole heads (q_norm and k_norm act per head, so they
  stay whole), o_proj row-parallel. A rank's paged KV holds its own KV heads only.
- MoE: the router stays whole. Every rank routes every row alike, because the rows are the
  same on every rank after each all-reduce. Each expert keeps a slice of its inner width I:
  ``gate_up`` [E, 2I, H] keeps the gate's and the up projection's rows of that slice, ``down``
  [E, H, I] its columns. The experts' partial sums meet in one all-reduce per layer.
- Dense SwiGLU layers (``mlp_only_layers``): gate and up column-parallel, down row-parallel.
- Token embeddings and the LM head vocab-parallel: the logits are gathered, or summed for a
  restricted id set.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar.layers.tensor_parallel import (
    ParallelLMHead,
    VocabParallelEmbedding,
    check_divisible,
    shard_range,
    vocab_slice,
)
from mstar.parallel.group import TPGroup
from mstar_graphs.qwen3_omni.moe import SparseMoE


def shard_moe(moe: SparseMoE, tp: TPGroup) -> None:
    if moe.gate_up is None or moe.down is None:
        raise RuntimeError("shard the MoE after fuse(): the sharding slices the fused expert tensors")
    check_divisible(tp, moe_intermediate_size=moe.inner)
    lo, hi = shard_range(moe.inner, tp)
    gate_up = moe.gate_up.detach()
    moe.gate_up = nn.Parameter(
        torch.cat([gate_up[:, lo:hi], gate_up[:, moe.inner + lo : moe.inner + hi]], dim=1), requires_grad=False
    )
    moe.down = nn.Parameter(moe.down.detach()[:, :, lo:hi].contiguous(), requires_grad=False)
    moe.inner = hi - lo
    if hasattr(moe, "shared_expert"):
        moe.shared_expert.shard(tp)  # its own down all-reduces; it joins after the experts' sum
    moe.tp = tp


def shard_thinker(thinker, tp: TPGroup):
    """``thinker`` (a loaded, fused :class:`~mstar_graphs.qwen3_omni.thinker.Thinker`) -> this rank's shard."""
    text = thinker.text
    check_divisible(
        tp,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads,
        vocab_size=text.vocab_size,
    )
    for layer in thinker.model.layers:
        layer.self_attn.shard(tp)
        if isinstance(layer.mlp, SparseMoE):
            shard_moe(layer.mlp, tp)
        else:
            layer.mlp.shard(tp)
    embed, start = vocab_slice(thinker.model.embed_tokens.weight, tp)
    thinker.model.embed_tokens = VocabParallelEmbedding(embed, start, text.vocab_size, tp)
    thinker.lm_head = ParallelLMHead(vocab_slice(thinker.lm_head.weight, tp)[0], start, text.vocab_size, tp)
    thinker.tp_size = tp.size
    return thinker
