"""The Orpheus SNAC stage: a stateless graph node turning a window of audio tokens into PCM.

Input edge ``codes``: int64 [7 * F] Orpheus audio token ids (F frames; the
streaming window is 28 tokens = 4 frames). Output ``audio``: float32 PCM at the
codec's rate (24 kHz), samples ``[keep_start:keep_end]`` of the decoded window
(by default the second frame, 2048:4096, as the Orpheus reference decoder keeps).

At the edges of a stream (chunk meta ``first`` / ``final``, sent by a
``SlidingWindowChunkPolicy(edges=True)``) the crop widens so no audio is lost:
the first window keeps ``[0, keep_end)``, the last ``[keep_start, end)``, one that
is both (or a stream shorter than a window) all of it. A final chunk that repeats
an already sent window (all of it context) keeps ``[keep_end, end)`` with that
window's noise.

Noise blocks get per-call noise from a generator seeded with
``window_noise_seed(call.seed, call.index)``, so audio does not depend on how
calls are batched, and an offline reference can reproduce it with
``torch.manual_seed(window_noise_seed(seed, index))`` before ``snac.SNAC.decode``.

With ``crop=True`` (the default) the decoder computes only the receptive field of
the kept samples (:meth:`SnacDecoder.decode_range`), equal to decoding the whole
window and slicing up to float reassociation; ``crop=False`` keeps the full path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.orpheus.graph import WINDOW_TOKENS
from mstar_graphs.orpheus.snac_decoder import SnacDecoder
from mstar_graphs.orpheus.tokens import AUDIO_TOKEN_BASE, CODEBOOK_SIZE, FRAME_TOKENS, tokens_to_snac_codes

ORPHEUS_VQ_STRIDES = [4, 2, 1]  # 1 + 2 + 4 codes per frame: the layout above assumes these strides

_MASK64 = (1 << 64) - 1


def window_noise_seed(seed: int, index: int) -> int:
    """Seed for the decoder noise of a request's ``index``-th window: a SplitMix64 mix of both.

    Deterministic, well spread for neighbouring (seed, index) pairs, and in
    [0, 2**63) so it is valid for ``torch.manual_seed`` and ``Generator.manual_seed``.
    """
    x = ((seed & _MASK64) * 0x9E3779B97F4A7C15 + (index & _MASK64) + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x & ((1 << 63) - 1)


def tokens_to_levels(tokens: torch.Tensor, *, request_id: str = "?") -> list[torch.Tensor]:
    """int [7F] Orpheus audio token ids -> SNAC codes [F], [2F], [4F] (coarse first).

    Raises ValueError naming the request, and the position and value of the first
    token outside its slot's range.
    """
    if tokens.dim() != 1 or tokens.numel() == 0 or tokens.numel() % FRAME_TOKENS != 0:
        raise ValueError(
            f"request {request_id}: 'codes' must be a 1-D tensor of 7*F audio tokens, got shape {tuple(tokens.shape)}"
        )
    try:
        return list(tokens_to_snac_codes(tokens.cpu()))
    except ValueError as exc:
        raise ValueError(f"request {request_id}: {exc}") from None


class OrpheusSnacStage(NodeSubmodule):
    """Stateless node: ``codes`` [7F] audio tokens -> ``audio`` float32 [keep_end - keep_start]."""

    def __init__(
        self, decoder: SnacDecoder, *, keep_start: int = 2048, keep_end: int = 4096, crop: bool = True
    ) -> None:
        super().__init__()
        if list(decoder.config.vq_strides) != ORPHEUS_VQ_STRIDES:
            raise ValueError(
                f"OrpheusSnacStage needs a SNAC with vq_strides {ORPHEUS_VQ_STRIDES} (the 24 kHz model), "
                f"got {decoder.config.vq_strides}"
            )
        if not 0 <= keep_start < keep_end:
            raise ValueError(f"OrpheusSnacStage: need 0 <= keep_start < keep_end, got [{keep_start}, {keep_end})")
        self.decoder = decoder.requires_grad_(False)  # inference only: forward builds no autograd graph
        self.keep_start, self.keep_end = keep_start, keep_end
        self.crop = crop
        self.sampling_rate = decoder.config.sampling_rate

    @classmethod
    def from_pretrained_dir(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        progress: bool = True,
        keep_start: int = 2048,
        keep_end: int = 4096,
        crop: bool = True,
    ) -> OrpheusSnacStage:
        decoder = SnacDecoder.from_pretrained_dir(path, dtype=dtype, progress=progress)
        return cls(decoder, keep_start=keep_start, keep_end=keep_end, crop=crop)

    @property
    def num_levels(self) -> int:
        return self.decoder.config.n_levels

    @property
    def num_noise(self) -> int:
        return len(self.decoder.noise_shapes(1, 1))

    def keep(self, call: NodeCall, n_samples: int) -> tuple[int, int, int]:
        """(first kept sample, end, noise index) of ``call``'s window of ``n_samples`` samples."""
        first, final = bool(call.meta.get("first")), bool(call.meta.get("final"))
        codes = call.inputs["codes"]
        if final and call.meta.get("left_context") == codes.numel():  # a sent window again: the rest of it
            return self.keep_end, n_samples, call.index - 1
        if final:  # the last window (the only one too, or a stream shorter than a window)
            return (0 if first else self.keep_start), n_samples, call.index
        if self.keep_end > n_samples:
            raise ValueError(
                f"request {call.request_id}: window of {n_samples // self.frame_samples} frames decodes to "
                f"{n_samples} samples, fewer than keep_end={self.keep_end}"
            )
        return (0 if first else self.keep_start), self.keep_end, call.index

    @property
    def frame_samples(self) -> int:
        return self.decoder.num_samples(ORPHEUS_VQ_STRIDES[0])

    def batch_key(self, call: NodeCall) -> object:
        """Windows share a batch when they have the same length and keep the same samples."""
        codes = call.inputs.get("codes")
        n = None if codes is None else codes.numel()
        return (n, bool(call.meta.get("first")), bool(call.meta.get("final")), call.meta.get("left_context") == n)

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict[str, Any]:
        """Tokens -> per-level code batches ``codes_{l}`` [B, T_l]; per-call noise ``noise_{i}`` [B, 1, T_i];
        ``keep`` (start, end): the samples every call of the batch keeps."""
        if not calls:
            raise ValueError("OrpheusSnacStage.prepare_inputs: empty batch")
        per_call_codes: list[list[torch.Tensor]] = []
        per_call_noise: list[list[torch.Tensor]] = []
        keeps: set[tuple[int, int]] = set()
        for call in calls:
            if "codes" not in call.inputs:
                raise ValueError(f"request {call.request_id}: missing input 'codes' (got {sorted(call.inputs)})")
            levels = tokens_to_levels(call.inputs["codes"], request_id=call.request_id)
            start, end, noise_index = self.keep(call, self.decoder.num_samples(levels[-1].numel()))
            keeps.add((start, end))
            per_call_codes.append(levels)
            gen = torch.Generator().manual_seed(window_noise_seed(call.seed, noise_index))
            per_call_noise.append(self.decoder.make_noise(gen, 1, levels[-1].numel()))
        shapes = {tuple(c[0].shape) for c in per_call_codes}
        if len(shapes) != 1 or len(keeps) != 1:
            raise ValueError(
                f"OrpheusSnacStage: windows of different lengths or crops in one batch: "
                f"{sorted(shapes)}, {sorted(keeps)}"
            )
        batch = {f"codes_{level}": torch.stack([c[level] for c in per_call_codes]) for level in range(self.num_levels)}
        for i in range(len(per_call_noise[0])):
            batch[f"noise_{i}"] = torch.cat([n[i] for n in per_call_noise])
        batch["keep"] = keeps.pop()
        return batch

    def warm_up_batches(self) -> list[dict[str, Any]]:
        """A window of a stream's middle (a new one every frame, the stream's bulk) alone and two together:
        what a compiling engine compiles this node for."""
        window = AUDIO_TOKEN_BASE + CODEBOOK_SIZE * (torch.arange(WINDOW_TOKENS) % FRAME_TOKENS)
        return [
            self.prepare_inputs([NodeCall(f"warm-up {i}", {"codes": window}, index=1) for i in range(calls)])
            for calls in (1, 2)
        ]

    def forward(self, **batch: Any) -> dict[str, torch.Tensor]:
        codes = [batch[f"codes_{level}"] for level in range(self.num_levels)]
        noise = [batch[f"noise_{i}"] for i in range(self.num_noise)]
        start, end = batch.get("keep", (self.keep_start, self.keep_end))
        if self.crop:
            audio = self.decoder.decode_range(codes, noise, start, end)  # [B, 1, kept]
            return {"audio": audio[:, 0].float()}
        audio = self.decoder.decode(codes, noise)  # [B, 1, samples]
        return {"audio": audio[:, 0, start:end].float()}
