"""Token-id prompts for the Qwen3-Omni tests (real Qwen special token ids; the tiny checkpoint keeps them)."""

from __future__ import annotations

# a user turn of three text tokens, then the generation prompt
TEXT_PROMPT = [151644, 872, 198, 100, 200, 300, 151645, 198, 151644, 77091, 198]


def audio_prompt(audio_tokens: int) -> list[int]:
    """<|im_start|>user\\n<|audio_start|><|audio_pad|>*N<|audio_end|><|im_end|>\\n<|im_start|>assistant\\n"""
    return [151644, 872, 198, 151669, *[151675] * audio_tokens, 151670, 151645, 198, 151644, 77091, 198]
