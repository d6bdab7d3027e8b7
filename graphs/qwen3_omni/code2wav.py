"""Code2Wav: 16 codebooks per 80 ms frame -> 24 kHz waveform, 1920 samples per frame, fully causal.

As transformers' ``Qwen3OmniMoeCode2Wav``: the 16 code embeddings of a frame are averaged; a
pre-transformer (RMSNorm, sliding-window causal attention over ``sliding_window`` frames with RoPE,
SwiGLU, per-channel layer scales) runs over the frames; two causal transposed convolutions with
ConvNeXt blocks upsample 4x; a causal conv decoder (SnakeBeta, transposed convs by 8, 5, 4, 3, and
dilated residual units) makes the samples, clamped to [-1, 1].

Causal convolutions pad on the left; causal transposed convolutions trim ``kernel - stride``
samples at both ends, so T frames give ``1920 T - 555`` samples: the last 555 depend on frames
not yet seen. ``decode_chunk`` decodes a chunk of frames after ``left_context`` frames of context
and keeps what follows the context, as the reference's ``chunked_decode`` does.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.common.rms_norm import RMSNorm
from mstar_graphs.common.rope import apply_rope
from mstar_graphs.qwen3_omni.config import Code2WavConfig
from mstar_graphs.qwen3_omni.decoder import rope_cos_sin
from mstar_graphs.qwen3_omni.moe import Expert


class CausalConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.left = self.span - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = (length - self.span + self.left) / self.stride + 1
        extra = (math.ceil(frames) - 1) * self.stride + (self.span - self.left) - length
        return self.conv(F.pad(x, (self.left, extra)))


class CausalTransConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., self.trim:y.shape[-1] - self.trim]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x).transpose(1, 2))
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(y)))
        return x + y.transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + sin(x e^alpha)^2 / (e^beta + 1e-9), per channel (alpha, beta stored as logs)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha, beta = self.alpha.exp()[None, :, None], self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate),
                                    *(ResidualUnit(cout, d) for d in (1, 3, 9))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, channels: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((channels,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class PreTransformerLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.window = cfg.sliding_window
        bias = cfg.attention_bias
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, self.heads * d, bias=bias)
        self.self_attn.k_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.self_attn.v_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.self_attn.o_proj = nn.Linear(self.heads * d, h, bias=bias)
        self.mlp = Expert(h, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype=torch.float32, device=None)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype=torch.float32, device=None)
        self.self_attn_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H]: causal attention over the last ``window`` frames."""
        b, t, _ = x.shape
        a = self.self_attn
        q = apply_rope(a.q_proj(x).reshape(b * t, self.heads, self.head_dim), cos, sin)
        k = apply_rope(a.k_proj(x).reshape(b * t, self.kv_heads, self.head_dim), cos, sin)
        v = a.v_proj(x).reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        i = torch.arange(t, device=x.device)
        visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - self.window)
        w = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
        w = w.masked_fill(~visible, torch.finfo(w.dtype).min)
        out = torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
        return a.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.attention(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Code2Wav(NodeSubmodule):
    """A stateless node: ``codes`` (a chunk of frames, each [num_quantizers] codes) -> ``audio`` [samples]."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, h)
        self.pre_transformer = nn.Module()
        self.pre_transformer.layers = nn.ModuleList(PreTransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.pre_transformer.norm = RMSNorm(h, cfg.rms_norm_eps, dtype=torch.float32, device=None)
        self.upsample = nn.ModuleList(nn.ModuleList([CausalTransConv(h, h, f, f), ConvNeXtBlock(h)])
                                      for f in cfg.upsampling_ratios)
        dims = [cfg.decoder_dim // 2 ** i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([CausalConv(h, cfg.decoder_dim, 7),
                                      *(DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)),
                                      SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)])
        self.register_buffer("code_offset", self._offsets(), persistent=False)

    def _offsets(self) -> torch.Tensor:
        # On the CPU even inside a meta-device build (a meta arange imports torch._dynamo, 2 s).
        return torch.arange(self.cfg.num_quantizers, device="cpu")[None, :, None] * self.cfg.codebook_size

    def reset_buffers(self) -> None:
        self.code_offset = self._offsets()

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.samples_per_frame

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, num_quantizers, T] int -> waveform [B, 1, samples_per_frame * T - lag] in [-1, 1]."""
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codes must be in [0, {self.cfg.codebook_size})")
        x = self.code_embedding(codes + self.code_offset).mean(1)
        t = x.shape[1]
        cos, sin = rope_cos_sin(torch.arange(t, device=x.device).repeat(x.shape[0]), self.cfg.head_dim,
                                self.cfg.theta, x.dtype)
        for layer in self.pre_transformer.layers:
            x = layer(x, cos, sin)
        x = self.pre_transformer.norm(x).transpose(1, 2)
        for blocks in self.upsample:
            for block in blocks:
                x = block(x)
        for block in self.decoder:
            x = block(x)
        return x.clamp(-1.0, 1.0)

    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """codes [B, Q, left_context + n] -> the chunk's own samples [B, 1, ...] (the context's dropped)."""
        return self.decode(codes)[..., left_context * self.samples_per_frame:]

    # -- as a graph node: the streamed frames of a chunk, with the chunk policy's left context --------
    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        chunks = []
        for c in calls:
            frames = c.inputs["codes"]
            frames = torch.stack(list(frames)) if isinstance(frames, (list, tuple)) else frames
            chunks.append(frames.reshape(-1, self.cfg.num_quantizers).T.long())
        return {"codes": chunks, "left_context": [int(c.meta.get("left_context", 0)) for c in calls]}

    def batch_key(self, call: NodeCall):
        frames = call.inputs["codes"]
        return ("code2wav", len(frames) if isinstance(frames, (list, tuple)) else frames.shape[0],
                int(call.meta.get("left_context", 0)))

    def forward(self, codes: list[torch.Tensor], left_context: list[int]) -> dict:  # type: ignore[override]
        out = self.decode_chunk(torch.stack(codes), left_context[0])  # a batch shares its shape (batch_key)
        return {"audio": out[:, 0]}
