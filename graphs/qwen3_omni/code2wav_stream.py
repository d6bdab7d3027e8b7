"""Code2Wav streamed: each request's chunks give the samples transformers' ``generate`` gives for them.

``generate`` decodes a reply's codes with ``code2wav.chunked_decode(codes, 300, 25)``: segments of 300
frames, each decoded after the 25 frames before it, each losing its last 555 samples (23 ms). A stream
here keeps, per request, what its next chunk reads of the past: the pre-transformer's K/V over its
attention window and each convolution's last inputs (``code2wav.StreamCache``). Every chunk then gives
exactly the samples its frames add to its segment's decode, and where a segment is full the stream
starts again after its last 25 frames, as the reference does. So the chunk sizes (a short first chunk
for a low time to first audio) change when audio comes out, not the audio.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mstar_graphs.qwen3_omni.decoder import rope_cos_sin

if TYPE_CHECKING:
    from mstar_graphs.qwen3_omni.code2wav import Code2Wav

SEGMENT_FRAMES, SEGMENT_CONTEXT = 300, 25  # as generate's code2wav.chunked_decode(codes, 300, 25)


class StreamCache:
    """What a batch of streams' convolutions keep between chunks: ``slot`` (a layer's name) ->
    [B, channels, samples] of its last inputs. A slot not there yet reads as zeros, which is the
    causal padding a whole decode puts before the first sample. ``first``: the streams' first chunk
    (the transposed convolutions trim their start there, as a whole decode does)."""

    def __init__(self, tensors: dict[str, torch.Tensor], first: bool) -> None:
        self.tensors = tensors
        self.first = first

    def past(self, slot: str, x: torch.Tensor, samples: int) -> torch.Tensor:
        kept = self.tensors.get(slot)
        return x.new_zeros(x.shape[0], x.shape[1], samples) if kept is None else kept

    def keep(self, slot: str, inputs: torch.Tensor, samples: int) -> None:
        self.tensors[slot] = inputs[..., inputs.shape[-1] - samples :]


@dataclass(frozen=True)
class Code2WavStream:
    """One request's stream between its chunks."""

    calls: int = 0  # chunks taken (the NodeCall.index the next one has)
    seen: int = 0  # the request's frames so far
    segment_start: int = 0  # the request's frame where the current segment's own frames begin
    frames: int = 0  # frames the segment's decode has taken, its context too (RoPE goes on from here)
    keys: tuple[torch.Tensor, ...] = ()  # per pre-transformer layer [kv_heads, <= window - 1, head_dim]
    values: tuple[torch.Tensor, ...] = ()
    convs: dict[str, torch.Tensor] = field(default_factory=dict)  # a convolution's slot -> its last inputs [C, n]
    recent: torch.Tensor | None = None  # the last SEGMENT_CONTEXT frames' codes [Q, <= 25]: a new segment's context


def decode_streams(
    code2wav: Code2Wav, chunks: list[torch.Tensor], streams: list[Code2WavStream]
) -> tuple[list[torch.Tensor], list[Code2WavStream]]:
    """Each request's next chunk of codes [Q, n] (n alike) -> its new samples, and its stream after them.
    The chunks that stay within their segment go through in one batch; one that fills its segment or
    starts the next goes alone."""
    audio: list[torch.Tensor | None] = [None] * len(chunks)
    after: list[Code2WavStream | None] = [None] * len(chunks)
    within = [
        i for i, (c, s) in enumerate(zip(chunks, streams)) if s.seen + c.shape[1] <= s.segment_start + SEGMENT_FRAMES
    ]
    if within:
        samples, stepped = stream_step(code2wav, torch.stack([chunks[i] for i in within]), [streams[i] for i in within])
        for i, got, stream in zip(within, samples, stepped):
            audio[i], after[i] = got, replace(_took(stream, chunks[i]), calls=stream.calls + 1)
    for i in (i for i in range(len(chunks)) if audio[i] is None):
        audio[i], after[i] = _across_segments(code2wav, chunks[i], streams[i])
    return audio, after  # type: ignore[return-value]


def _took(stream: Code2WavStream, codes: torch.Tensor) -> Code2WavStream:
    """``stream`` after it decoded ``codes`` [Q, n]: their frames counted, the last ones kept as context."""
    recent = codes if stream.recent is None else torch.cat([stream.recent, codes], dim=1)
    return replace(stream, seen=stream.seen + codes.shape[1], recent=recent[:, -SEGMENT_CONTEXT:].clone())


def _across_segments(
    code2wav: Code2Wav, codes: torch.Tensor, stream: Code2WavStream
) -> tuple[torch.Tensor, Code2WavStream]:
    """One request's chunk that reaches a segment's end: each piece in its segment, a new segment
    primed with the 25 frames before it (their samples dropped, and the 555 the reference drops too)."""
    pieces, calls = [], stream.calls
    drop = 0
    while codes.shape[1]:
        room = stream.segment_start + SEGMENT_FRAMES - stream.seen
        if room == 0:
            context = stream.recent
            assert context is not None and context.shape[1] == SEGMENT_CONTEXT  # a full segment has 300 frames
            fresh = Code2WavStream(calls=calls, seen=stream.seen, segment_start=stream.seen, recent=context)
            primed, (stream,) = stream_step(code2wav, context[None], [fresh])
            # the reference keeps the new segment's decode after its context's 25 whole frames
            drop = SEGMENT_CONTEXT * code2wav.samples_per_frame - primed[0].shape[-1]
            continue
        take = codes[:, :room]
        (samples,), (stream,) = stream_step(code2wav, take[None], [stream])
        pieces.append(samples[drop:])
        drop = max(0, drop - samples.shape[-1])
        stream = _took(stream, take)
        codes = codes[:, take.shape[1] :]
    return torch.cat(pieces), replace(stream, calls=calls + 1)


def stream_step(
    code2wav: Code2Wav, codes: torch.Tensor, streams: list[Code2WavStream]
) -> tuple[list[torch.Tensor], list[Code2WavStream]]:
    """n more frames [B, Q, n] of B streams, all at their segment's start or none: the samples they add
    to each segment's decode, and the streams with their caches moved on (``frames`` counted)."""
    first = streams[0].frames == 0
    if any((s.frames == 0) != first for s in streams):
        raise ValueError("a Code2Wav batch mixes streams at their start with streams under way")
    cfg = code2wav.cfg
    x = code2wav.embed(codes)
    b, n, _ = x.shape
    device = x.device
    kept = [s.keys[0].shape[1] if s.keys else 0 for s in streams]
    longest = max(kept)
    positions = torch.cat([torch.arange(s.frames, s.frames + n) for s in streams]).to(device)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.theta, x.dtype)
    # key slots: each stream's cached frames right-aligned in `longest`, then the n new ones
    back = torch.arange(n, device=device)[:, None] + longest - torch.arange(longest + n, device=device)[None, :]
    in_window = (back >= 0) & (back < cfg.sliding_window)  # [n, longest + n]
    cached = torch.arange(longest + n, device=device)[None, :] >= longest - torch.tensor(kept, device=device)[:, None]
    visible = (in_window[None] & cached[:, None, :])[:, None]  # [B, 1, n, longest + n]
    layers = code2wav.pre_transformer.layers
    keys, values = [], []
    for i, layer in enumerate(layers):
        past_k = _right_aligned([s.keys[i] for s in streams] if longest else [], longest)
        past_v = _right_aligned([s.values[i] for s in streams] if longest else [], longest)
        x, k, v = layer(x, cos, sin, past_k, past_v, visible)
        keys.append(k)
        values.append(v)
    convs = StreamCache(_batched_convs(streams), first)
    audio = code2wav.synthesize(code2wav.pre_transformer.norm(x).transpose(1, 2), convs)
    window = cfg.sliding_window - 1
    out = []
    for row, s in enumerate(streams):
        have = min(kept[row] + n, window)
        out.append(
            replace(
                s,
                frames=s.frames + n,
                keys=tuple(k[row, :, k.shape[2] - have :].clone() for k in keys),
                values=tuple(v[row, :, v.shape[2] - have :].clone() for v in values),
                convs={slot: t[row].clone() for slot, t in convs.tensors.items()},
            )
        )
    return [audio[row, 0] for row in range(b)], out


def _right_aligned(rows: list[torch.Tensor], length: int) -> torch.Tensor | None:
    """Per-stream [kv_heads, P_i, D] -> [B, kv_heads, length, D], each ending at the right (the left is masked)."""
    if not rows:
        return None
    return torch.stack([F.pad(r, (0, 0, length - r.shape[1], 0)) for r in rows])


def _batched_convs(streams: list[Code2WavStream]) -> dict[str, torch.Tensor]:
    """The streams' convolution inputs, slot by slot, as one batch (none at a segment's start)."""
    return {slot: torch.stack([s.convs[slot] for s in streams]) for slot in streams[0].convs}
