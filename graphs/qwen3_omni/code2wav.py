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

Each layer also streams (``stream``): it keeps what its next chunk reads of the past (the attention's
K/V over the window, each convolution's last inputs; ``StreamCache``), so a stream decoded chunk by
chunk gives the samples a whole decode gives (``code2wav_stream``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.common.attention import GQAttention
from mstar_graphs.common.mlp import GatedMLP
from mstar_graphs.common.rms_norm import RMSNorm
from mstar_graphs.qwen3_omni.code2wav_stream import Code2WavStream, StreamCache, decode_streams
from mstar_graphs.qwen3_omni.config import Code2WavConfig
from mstar_graphs.qwen3_omni.decoder import rope_cos_sin


def stream_through(layer: nn.Module, x: torch.Tensor, cache: StreamCache) -> torch.Tensor:
    """A layer that keeps state streams; a pointwise one (SnakeBeta) just runs."""
    stream = getattr(layer, "stream", None)
    return stream(x, cache) if stream is not None else layer(x)


class CausalConv(nn.Module):
    slot = ""  # its name in Code2Wav (the key of what it keeps when streaming)

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

    def stream(self, x: torch.Tensor, cache: StreamCache) -> torch.Tensor:
        """The next samples of a stream: its last ``left`` inputs go before them (stride 1, as all of
        Code2Wav's: the whole decode's right padding is then empty)."""
        if self.stride != 1:
            raise NotImplementedError("a strided causal convolution does not stream")
        if self.left:
            x = torch.cat([cache.past(self.slot, x, self.left), x], dim=-1)
            cache.keep(self.slot, x, self.left)
        return self.conv(x)


class CausalTransConv(nn.Module):
    slot = ""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.trim = kernel - stride
        self.reach = -(-self.trim // stride)  # earlier inputs whose kernels overlap a chunk's first outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., self.trim : y.shape[-1] - self.trim]

    def stream(self, x: torch.Tensor, cache: StreamCache) -> torch.Tensor:
        """Input samples [i0, i1) complete the outputs [stride i0, stride i1) (later ones also take
        input i1); the stream's first chunk drops the ``trim`` the whole decode drops at its start."""
        n, s = x.shape[-1], self.stride
        if self.reach:
            x = torch.cat([cache.past(self.slot, x, self.reach), x], dim=-1)
            cache.keep(self.slot, x, self.reach)
        y = self.conv(x)[..., s * self.reach : s * (self.reach + n)]
        return y[..., self.trim :] if cache.first else y


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._after_dwconv(x, self.dwconv(x))

    def stream(self, x: torch.Tensor, cache: StreamCache) -> torch.Tensor:
        return self._after_dwconv(x, self.dwconv.stream(x, cache))

    def _after_dwconv(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y = self.norm(y.transpose(1, 2))
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

    def stream(self, x: torch.Tensor, cache: StreamCache) -> torch.Tensor:
        return x + self.conv2.stream(self.act2(self.conv1.stream(self.act1(x), cache)), cache)


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate), *(ResidualUnit(cout, d) for d in (1, 3, 9))]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x

    def stream(self, x: torch.Tensor, cache: StreamCache) -> torch.Tensor:
        for layer in self.block:
            x = stream_through(layer, x, cache)
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
        # its own windowed attention over dense K/V (below): no engine KV layer, so no layer index
        self.self_attn = GQAttention(h, self.heads, self.kv_heads, d, layer_idx=-1, bias=cfg.attention_bias)
        self.mlp = GatedMLP(h, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype=torch.float32, device=None)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps, dtype=torch.float32, device=None)
        self.self_attn_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(h, cfg.layer_scale_initial_scale)

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_k: torch.Tensor | None = None,
        past_v: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> (out, keys, values): causal attention over the last ``window`` frames. A stream
        passes its earlier keys and values [B, kv_heads, P, D] and which of them each frame sees
        (``visible`` [B, 1, T, P + T]); the keys and values returned are theirs and the T new ones."""
        b, t, width = x.shape
        q, k, v = self.self_attn.project(x.reshape(b * t, width), cos, sin)
        q = q.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if past_k is not None:
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        keys, values = k, v
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        if visible is None:
            i = torch.arange(t, device=x.device)
            visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - self.window)
        w = torch.matmul(q, k.transpose(2, 3)) * self.head_dim**-0.5
        w = w.masked_fill(~visible, torch.finfo(w.dtype).min)
        out = torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
        return self.self_attn.o_proj(out.transpose(1, 2).reshape(b, t, -1)), keys, values

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_k: torch.Tensor | None = None,
        past_v: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, keys, values = self.attention(self.input_layernorm(x), cos, sin, past_k, past_v, visible)
        x = x + self.self_attn_layer_scale(attended)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x))), keys, values


class Code2Wav(NodeSubmodule):
    """A streaming node: ``codes`` (a chunk of frames, each [num_quantizers] codes) -> ``audio`` [samples].

    Each request's chunks go through in order (``sequential_calls``): the node keeps the request's
    stream (``code2wav_stream.Code2WavStream``) from one chunk to the next, until the request ends."""

    sequential_calls = True

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, h)
        self.pre_transformer = nn.Module()
        self.pre_transformer.layers = nn.ModuleList(PreTransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.pre_transformer.norm = RMSNorm(h, cfg.rms_norm_eps, dtype=torch.float32, device=None)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(h, h, f, f), ConvNeXtBlock(h)]) for f in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [
                CausalConv(h, cfg.decoder_dim, 7),
                *(DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)),
                SnakeBeta(dims[-1]),
                CausalConv(dims[-1], 1, 7),
            ]
        )
        self.register_buffer("code_offset", self._offsets(), persistent=False)
        for name, module in self.named_modules():
            if isinstance(module, (CausalConv, CausalTransConv)):
                module.slot = name
        self._streams: dict[str, Code2WavStream] = {}  # request id -> its stream (between its chunks)

    def _offsets(self) -> torch.Tensor:
        # On the CPU even inside a meta-device build (a meta arange imports torch._dynamo, 2 s).
        return torch.arange(self.cfg.num_quantizers, device="cpu")[None, :, None] * self.cfg.codebook_size

    def reset_buffers(self) -> None:
        self.code_offset = self._offsets()

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.samples_per_frame

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, num_quantizers, T] int -> the frames' mean code embeddings [B, T, hidden]."""
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [B, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codes must be in [0, {self.cfg.codebook_size})")
        return self.code_embedding(codes + self.code_offset).mean(1)

    def synthesize(self, x: torch.Tensor, cache: StreamCache | None = None) -> torch.Tensor:
        """The pre-transformer's output [B, hidden, T] -> samples [B, 1, ...] in [-1, 1]: the upsampling
        and the conv decoder, over the whole input, or as the next piece of streams (``cache``)."""
        for layer in (*(block for blocks in self.upsample for block in blocks), *self.decoder):
            x = layer(x) if cache is None else stream_through(layer, x, cache)
        return x.clamp(-1.0, 1.0)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, num_quantizers, T] int -> waveform [B, 1, samples_per_frame * T - lag] in [-1, 1]."""
        x = self.embed(codes)
        t = x.shape[1]
        cos, sin = rope_cos_sin(
            torch.arange(t, device=x.device).repeat(x.shape[0]), self.cfg.head_dim, self.cfg.theta, x.dtype
        )
        for layer in self.pre_transformer.layers:
            x = layer(x, cos, sin)[0]
        return self.synthesize(self.pre_transformer.norm(x).transpose(1, 2))

    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """codes [B, Q, left_context + n] -> the chunk's own samples [B, 1, ...] (the context's dropped)."""
        return self.decode(codes)[..., left_context * self.samples_per_frame :]

    # -- as a graph node: each request's chunks, in order, through its stream ----------------------
    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        chunks, streams = [], []
        for c in calls:
            if int(c.meta.get("left_context", 0)):
                raise ValueError("Code2Wav keeps each stream's context itself: its chunks come without left context")
            frames = c.inputs["codes"]
            frames = torch.stack(list(frames)) if isinstance(frames, (list, tuple)) else frames
            chunks.append(frames.reshape(-1, self.cfg.num_quantizers).T.long())
            stream = self._streams.get(c.request_id, Code2WavStream())
            if stream.calls != c.index:
                raise ValueError(
                    f"request {c.request_id}: Code2Wav chunk {c.index} came after {stream.calls} "
                    "chunk(s) of its stream (its earlier chunks ran elsewhere?)"
                )
            streams.append(stream)
        return {"codes": chunks, "streams": streams, "request_ids": [c.request_id for c in calls]}

    def batch_key(self, call: NodeCall):
        frames = call.inputs["codes"]
        return ("code2wav", len(frames) if isinstance(frames, (list, tuple)) else frames.shape[0], call.index == 0)

    def forward(
        self,
        codes: list[torch.Tensor],
        streams: list[Code2WavStream],  # type: ignore[override]
        request_ids: list[str],
    ) -> dict:
        audio, after = decode_streams(self, codes, streams)
        self._streams.update(zip(request_ids, after))  # only now: a failed batch leaves every stream as it was
        return {"audio": audio}

    def release(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
