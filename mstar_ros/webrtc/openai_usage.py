"""Token counts in OpenAI's ``usage`` shapes, from what a request carried and what it streamed.

Prompt tokens are the request's token-id inputs (every integer input named ``ids`` or ``*_ids``: the
prompt, and the text a speech request says; BAGEL's context ``ids``, its image rows included); a prompt's audio and image tokens are its placeholders, counted
by the ids a model names in ``special_token_ids`` (``audio``, ``image``). Output audio tokens are the
items a model streams on ``audio_token_output`` (Orpheus: its LLM's tokens; Qwen3-Omni: Talker frames).
A model that names neither gets zeros there, never a guess.
"""

from __future__ import annotations

import torch

from mstar.request import Request


def prompt_tokens(request: Request) -> int:
    return sum(
        int(v.numel())
        for k, v in request.inputs.items()
        if (k == "ids" or k.endswith("_ids")) and isinstance(v, torch.Tensor) and not v.is_floating_point()
    )


def placeholder_tokens(model, request: Request, kind: str) -> int:
    """The prompt's tokens that stand for ``kind`` ("audio", "image") in the model's prompt."""
    token = (getattr(model, "special_token_ids", None) or {}).get(kind)
    ids = request.inputs.get("prompt_ids")
    return 0 if token is None or ids is None else int((ids == token).sum())


def speech_usage(input_tokens: int, output_tokens: int) -> dict:
    """``usage`` of ``speech.audio.done``."""
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}


def chat_usage(model, request: Request, text_tokens: int, audio_tokens: int) -> dict:
    """``usage`` of a chat completion, with the details objects OpenAI's client types have."""
    prompt = prompt_tokens(request)
    audio_in, image_in = placeholder_tokens(model, request, "audio"), placeholder_tokens(model, request, "image")
    completion = text_tokens + audio_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": 0,
            "audio_tokens": audio_in,
            "image_tokens": image_in,
            "text_tokens": prompt - audio_in - image_in,
        },
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": audio_tokens,
            "text_tokens": text_tokens,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
