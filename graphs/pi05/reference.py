"""A dense pi0.5 reference: no paged KV, no engine; prefix and suffix recomputed jointly every step.

This is openpi's training-style forward (``PaliGemmaWithExpertModel.forward`` with both
inputs): each layer projects the prefix rows with the LM's weights and the action rows
with the expert's, concatenates them, runs one masked attention (prefix rows see the
prefix; action rows see everything: mask_ar = [0] * P + [1] + [0] * (H - 1)), then
splits them again. It shares only the parameter tensors with :class:`Pi05Model` - all
math here is written out separately (HF-style full-width RoPE, eager softmax in fp32),
so "persisted prefix KV == recompute every step" is checked against independent code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mstar_graphs.pi05.pi05 import Pi05Model


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _heads(hp: torch.Tensor, hs: torch.Tensor, w_p: torch.Tensor, w_e: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """Prefix rows through the LM's projection, action rows through the expert's -> [n, P + H, d]."""
    return torch.cat([hp @ w_p.T, hs @ w_e.T]).view(-1, n, d).transpose(0, 1)


def _time_embedding(t: float, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    x = torch.tensor(t, dtype=torch.float32).to(torch.float64) * (2 * math.pi / period)
    return torch.cat([x.sin(), x.cos()]).float()


def prefix_embeddings(
    model: Pi05Model, input_ids: torch.Tensor, embeds: torch.Tensor | None, embed_mask: torch.Tensor | None
) -> torch.Tensor:
    """[P, width]: token rows scaled by sqrt(width); image rows (packed, in order) as given."""
    weight = model.llm.embed_tokens.weight
    h = weight[input_ids.clamp(0, weight.shape[0] - 1)] * math.sqrt(weight.shape[1])
    if embeds is not None:
        assert embed_mask is not None
        h = h.clone()
        h[embed_mask] = embeds.reshape(-1, weight.shape[1]).to(h.dtype)
    return h


def joint_forward(
    model: Pi05Model, prefix: torch.Tensor, suffix: torch.Tensor, cond: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """prefix [P, Wp], suffix [H, We], cond [We] -> final-normed (prefix [P, Wp], suffix [H, We])."""
    c = model.config
    eps, d, nh, nkv = c.rms_norm_eps, c.prefix.head_dim, c.prefix.num_heads, c.prefix.num_kv_heads
    p_len, h_len = prefix.shape[0], suffix.shape[0]
    pos = torch.arange(p_len + h_len, dtype=torch.float32)
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = pos[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    ar = torch.tensor([0] * p_len + [1] + [0] * (h_len - 1))
    cum = ar.cumsum(0)
    allowed = cum[None, :] <= cum[:, None]  # [query, key]

    def ada(norm: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift, gate = F.linear(cond, norm.dense.weight, norm.dense.bias).chunk(3)
        return _rms(x, eps) * (1 + scale) + shift, gate

    for lp, le in zip(model.llm.layers, model.expert.model.layers):
        hp = _rms(prefix, eps) * (1 + lp.input_layernorm.weight)
        hs, gate = ada(le.input_layernorm, suffix)
        ap, ae = lp.self_attn, le.self_attn
        q = _heads(hp, hs, ap.q_proj.weight, ae.q_proj.weight, nh, d)
        k = _heads(hp, hs, ap.k_proj.weight, ae.k_proj.weight, nkv, d)
        v = _heads(hp, hs, ap.v_proj.weight, ae.v_proj.weight, nkv, d)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        scores = (q @ k.transpose(1, 2)) * d**-0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = (scores.float().softmax(-1).to(q.dtype) @ v).transpose(0, 1).reshape(p_len + h_len, nh * d)
        prefix = prefix + out[:p_len] @ ap.o_proj.weight.T
        suffix = suffix + (out[p_len:] @ ae.o_proj.weight.T) * gate

        hp = _rms(prefix, eps) * (1 + lp.post_attention_layernorm.weight)
        hs, gate = ada(le.post_attention_layernorm, suffix)
        for x_in, mlp, is_suffix in ((hp, lp.mlp, False), (hs, le.mlp, True)):
            y = (
                F.gelu(x_in @ mlp.gate_proj.weight.T, approximate="tanh") * (x_in @ mlp.up_proj.weight.T)
            ) @ mlp.down_proj.weight.T
            if is_suffix:
                suffix = suffix + y * gate
            else:
                prefix = prefix + y
    out_p = _rms(prefix, eps) * (1 + model.llm.norm.weight)
    out_s, _ = ada(model.expert.model.norm, suffix)
    return out_p, out_s


@torch.no_grad()
def sample_actions(
    model: Pi05Model,
    input_ids: torch.Tensor,
    noise: torch.Tensor,
    *,
    embeds: torch.Tensor | None = None,
    embed_mask: torch.Tensor | None = None,
    steps: int | None = None,
) -> torch.Tensor:
    """One sequence: prefix ids [P] (+ image rows), noise [H, A] at t = 1 -> actions [H, A] at t = 0,
    with ``steps`` Euler steps, each a full joint forward of prefix + action rows."""
    c, e = model.config, model.expert
    steps = steps or c.num_steps
    prefix = prefix_embeddings(model, input_ids, embeds, embed_mask)
    x = noise.float()
    dt = -1.0 / steps
    for k in range(steps):
        t = 1.0 - k / steps
        temb = _time_embedding(t, c.expert.width, c.min_period, c.max_period)
        cond = F.silu(
            F.linear(
                F.silu(F.linear(temb, e.time_mlp_in.weight, e.time_mlp_in.bias)),
                e.time_mlp_out.weight,
                e.time_mlp_out.bias,
            )
        )
        suffix = F.linear(x, e.action_in_proj.weight, e.action_in_proj.bias)
        _, out = joint_forward(model, prefix, suffix, cond)
        v = F.linear(out, e.action_out_proj.weight, e.action_out_proj.bias)
        x = x + dt * v
    return x


@torch.no_grad()
def prefix_hidden(
    model: Pi05Model,
    input_ids: torch.Tensor,
    *,
    embeds: torch.Tensor | None = None,
    embed_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The prefix LM's final hidden states [P, Wp] (bidirectional prefix), densely."""
    prefix = prefix_embeddings(model, input_ids, embeds, embed_mask)
    width = model.config.expert.width
    out, _ = joint_forward(model, prefix, torch.zeros(1, width), torch.zeros(width))  # one dummy action row
    return out
