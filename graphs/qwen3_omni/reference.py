"""transformers' ``Qwen3OmniMoeForConditionalGeneration`` as the reference (tests and benchmarks only).

Loaded from the same checkpoint directory with eager attention and eager experts, the settings
under which it is deterministic to the last bits on CPU. :func:`reference_generate` runs its
``generate(return_audio=True)`` and also returns the codes it handed Code2Wav.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


def load_reference(path: str | Path, dtype: torch.dtype = torch.float32):
    from transformers import Qwen3OmniMoeForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(path), dtype=dtype, attn_implementation="eager", experts_implementation="eager"
    ).eval()


@dataclass
class ReferenceReply:
    text_ids: list[int]
    codes: torch.Tensor  # [groups, frames]
    audio: torch.Tensor  # [samples]


@torch.inference_mode()
def reference_generate(
    model,
    prompt_ids: list[int],
    *,
    input_features: torch.Tensor | list[torch.Tensor] | None = None,
    images: list[tuple[torch.Tensor, tuple[int, int, int]]] | None = None,
    thinker_max_new_tokens: int = 32,
    talker_max_new_tokens: int = 64,
    speaker: str = "Ethan",
    sample: bool = False,
    seed: int = 0,
) -> ReferenceReply:
    """One request through ``generate(return_audio=True)``; greedy unless ``sample`` (the Talker's defaults)."""
    captured: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def capture(codes, *args, **kwargs):
        captured.append(codes.clone())
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = capture
    kwargs = {}
    if input_features is not None:  # clips [mels, frames], in prompt order: padded to the longest, masked
        clips = [input_features] if isinstance(input_features, torch.Tensor) else list(input_features)
        longest = max(c.shape[1] for c in clips)
        kwargs["input_features"] = torch.stack([torch.nn.functional.pad(c, (0, longest - c.shape[1])) for c in clips])
        kwargs["feature_attention_mask"] = torch.stack([(torch.arange(longest) < c.shape[1]).long() for c in clips])
    if images:  # (pixel_values, grid_thw) per image, as our image preprocessor makes them
        kwargs["pixel_values"] = torch.cat([v for v, _ in images])
        kwargs["image_grid_thw"] = torch.tensor([list(g) for _, g in images])
    try:
        torch.manual_seed(seed)
        sequences, wav = model.generate(
            input_ids=torch.tensor([prompt_ids]),
            speaker=speaker,
            thinker_max_new_tokens=thinker_max_new_tokens,
            talker_max_new_tokens=talker_max_new_tokens,
            thinker_do_sample=False,
            talker_do_sample=sample,
            **kwargs,
        )
    finally:
        del model.code2wav.chunked_decode
    return ReferenceReply(sequences[0, len(prompt_ids) :].tolist(), captured[0][0], wav.reshape(-1))
