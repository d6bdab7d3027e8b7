"""The Thinker's audio encoder: 128-bin log-mel frames -> one embedding per ~77 ms, in the Thinker's width.

As transformers' ``Qwen3OmniMoeAudioEncoder`` computes it, per clip:

1. the clip's frames are cut into chunks of ``2 * n_window`` (100) frames, the tail chunk shorter;
   the chunks are zero-padded to the clip's longest chunk;
2. three 3x3 stride-2 convolutions (GELU) shrink each chunk 8x in time and frequency; the
   (channel, frequency) features are flattened and projected to ``d_model``; a sinusoid
   position table is added, restarting at 0 in every chunk; the padding's outputs are dropped;
3. transformer layers attend bidirectionally within windows of ``n_window_infer / (2 n_window)``
   chunks (never across clips);
4. LayerNorm, then ``proj2(gelu(proj1(.)))`` to the Thinker's hidden size.

The padding of step 1 changes the tail chunk's last outputs slightly (the convolutions see
zeros), so each clip is padded as it would be alone: batching clips of several requests gives
each the embeddings it gets alone. Clips are batched per padded chunk length in the
convolutions and per window in attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.qwen3_omni.audio_features import HOP, MAX_SECONDS, SAMPLE_RATE, floor_and_scale
from mstar_graphs.qwen3_omni.config import AudioEncoderConfig

MAX_FRAMES = int(MAX_SECONDS * SAMPLE_RATE) // HOP


def tokens_for_frames(frames: int, n_window: int = 50) -> int:
    """Embeddings the encoder makes from ``frames`` mel frames (13 per full 100-frame chunk)."""
    chunk = 2 * n_window
    tail = frames % chunk
    after_convs = tail
    for _ in range(3):
        after_convs = (after_convs - 1) // 2 + 1 if after_convs > 0 else 0
    return after_convs + _full_chunk_tokens(chunk) * (frames // chunk)


def _full_chunk_tokens(chunk: int) -> int:
    n = chunk
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


def sinusoid_table(length: int, channels: int) -> torch.Tensor:
    """[length, channels]: sin of the first half of the frequencies, then cos (Whisper's table).

    On the CPU even inside a meta-device build: meta kernels for these ops import torch._dynamo (2 s)."""
    increment = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2, device="cpu").float())
    angles = torch.arange(length, device="cpu")[:, None].float() * inv[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class AudioAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d) for _ in range(3))
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, windows: list[int]) -> torch.Tensor:
        """x [N, d] rows of all windows back to back; ``windows`` their lengths."""
        n = x.shape[0]
        q, k, v = (
            p(x).reshape(n, self.heads, self.head_dim).transpose(0, 1) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        outs = []
        start = 0
        for length in windows:  # bidirectional within a window
            sl = slice(start, start + length)
            w = torch.matmul(q[:, sl], k[:, sl].transpose(1, 2)) * self.head_dim**-0.5
            outs.append(torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v[:, sl]))
            start += length
        out = torch.cat(outs, dim=1).transpose(0, 1).reshape(n, -1)
        return self.out_proj(out)


class AudioEncoderLayer(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = AudioAttention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, windows: list[int]) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), windows)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(NodeSubmodule):
    """A stateless node: input ``features`` [128, frames] per call (several clips, split by
    ``clip_frames``), and/or a streamed turn's unfloored ``log_mel`` frames (a list of pieces) -> output
    ``embeds`` [tokens, hidden], every clip's back to back."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        if cfg.activation_function != "gelu":
            raise ValueError(f"audio_config.activation_function {cfg.activation_function!r}: only gelu is implemented")
        self.cfg = cfg
        c = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, c, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, 2, padding=1)
        freq = cfg.num_mel_bins
        for _ in range(3):
            freq = (freq + 1) // 2
        self.conv_out = nn.Linear(c * freq, cfg.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        self.register_buffer("positions", sinusoid_table(cfg.max_source_positions, cfg.d_model), persistent=False)

    def reset_buffers(self) -> None:
        self.positions = sinusoid_table(self.cfg.max_source_positions, self.cfg.d_model).to(self.proj1.weight.dtype)

    # -- the node's batch: clips of any lengths --------------------------------------------------
    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        """Per call, its clips in prompt order: ``features`` (one clip, or several back to back, as
        ``clip_frames`` splits them: a conversation's earlier spoken turns), then a streamed turn's frames."""
        clips, counts = [], []
        for c in calls:
            mine = []
            if "features" in c.inputs:
                f = c.inputs["features"]
                if f.dim() != 2 or f.shape[0] != self.cfg.num_mel_bins:
                    raise ValueError(f"audio features must be [{self.cfg.num_mel_bins}, frames], got {tuple(f.shape)}")
                lengths = [int(n) for n in c.inputs["clip_frames"]] if "clip_frames" in c.inputs else [f.shape[1]]
                if sum(lengths) != f.shape[1] or min(lengths, default=0) < 1:
                    raise ValueError(f"clip_frames {lengths} must be positive and add up to the {f.shape[1]} frames")
                mine += list(f.split(lengths, dim=1))
            if "log_mel" in c.inputs:  # a streamed turn's frames (mstar_graphs.qwen3_omni.audio_stream), whole now
                frames = torch.cat(list(c.inputs["log_mel"]), dim=1)
                if frames.shape[1] > MAX_FRAMES:
                    raise ValueError(f"audio of {frames.shape[1]} frames is over the {MAX_FRAMES} frame limit")
                if frames.shape[1] == 0:
                    raise ValueError("the streamed turn made no audio frames")
                mine.append(floor_and_scale(frames))
            for f in mine:
                if f.shape[1] == 0:
                    raise ValueError("an audio clip has no frames")
                if not torch.isfinite(f).all():
                    raise ValueError("audio features contain NaN or infinite values")
            if not mine:
                raise ValueError("an audio encoder call without audio")
            clips += mine
            counts.append(len(mine))
        return {"clips": clips, "counts": counts}

    def split_outputs(self, outputs, calls):
        return [{"embeds": e} for e in outputs["embeds"]]

    def batch_key(self, call: NodeCall):
        return "audio"  # any lengths batch together

    def forward(self, clips: list[torch.Tensor], counts: list[int]) -> dict[str, list[torch.Tensor]]:  # type: ignore[override]
        """Each clip encoded as it is alone; a call's clips' embeddings back to back, in order."""
        per_clip = self.encode(clips)
        out, at = [], 0
        for n in counts:
            out.append(torch.cat(per_clip[at : at + n]))
            at += n
        return {"embeds": out}

    # -- the computation -----------------------------------------------------------------------------
    def encode(self, clips: list[torch.Tensor]) -> list[torch.Tensor]:
        """clips: [mels, frames_i] each -> [tokens_i, output_dim] each."""
        chunk = 2 * self.cfg.n_window
        dtype = self.conv2d1.weight.dtype
        pieces: list[tuple[int, torch.Tensor, int]] = []  # (clip, chunk padded to the clip's longest, valid frames)
        for i, clip in enumerate(clips):
            frames = clip.shape[1]
            longest = chunk if frames >= chunk else frames
            for start in range(0, frames, chunk):
                part = clip[:, start : start + chunk]
                pieces.append((i, F.pad(part, (0, longest - part.shape[1])), part.shape[1]))
        # convolutions batched over pieces of one padded length
        rows: list[torch.Tensor | None] = [None] * len(pieces)
        by_length: dict[int, list[int]] = {}
        for j, (_, padded, _) in enumerate(pieces):
            by_length.setdefault(padded.shape[1], []).append(j)
        for _length, members in by_length.items():
            x = torch.stack([pieces[j][1] for j in members])[:, None].to(dtype)
            for start in range(0, x.shape[0], self.cfg.conv_chunksize):
                part = x[start : start + self.cfg.conv_chunksize]
                y = F.gelu(self.conv2d3(F.gelu(self.conv2d2(F.gelu(self.conv2d1(part))))))
                b, c, f, t = y.shape
                y = self.conv_out(y.permute(0, 3, 1, 2).reshape(b, t, c * f)) + self.positions[:t].to(y.dtype)
                for j, row in zip(members[start:], y):
                    rows[j] = row[: tokens_for_frames(pieces[j][2], self.cfg.n_window)]
        # attention windows, per clip
        hidden, windows, per_clip = [], [], []
        full = _full_chunk_tokens(chunk)
        for i, clip in enumerate(clips):
            h = torch.cat([rows[j] for j, p in enumerate(pieces) if p[0] == i])
            longest_tokens = full if clip.shape[1] >= chunk else h.shape[0]
            window = longest_tokens * (self.cfg.n_window_infer // chunk)
            windows += [window] * (h.shape[0] // window) + ([h.shape[0] % window] if h.shape[0] % window else [])
            hidden.append(h)
            per_clip.append(h.shape[0])
        x = torch.cat(hidden)
        for layer in self.layers:
            x = layer(x, windows)
        x = self.proj2(F.gelu(self.proj1(self.ln_post(x))))
        return list(x.split(per_clip))
