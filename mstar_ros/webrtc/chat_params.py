"""What ``/v1/chat/completions`` takes besides the messages: every field of OpenAI's request either
honoured or refused with a 400 naming it (``param``), never silently dropped.

Honoured: ``model``, ``modalities``, ``audio`` (``voice``; ``format`` wav, mp3, flac, opus, aac or
pcm16, and pcm16 when streaming, as OpenAI), ``stream``, ``stream_options.include_usage``,
``max_tokens`` / ``max_completion_tokens`` (the reply's text tokens and its audio frames), ``seed``,
``temperature`` (0-2) and ``top_p`` (0-1; 0 is greedy) of the text, ``n`` = 1. Refused unless at their
"off" value: ``n`` > 1, ``logprobs``, ``top_logprobs``, ``logit_bias``, ``frequency_penalty`` /
``presence_penalty`` other than 0, ``stop``, ``tools`` / ``functions`` and a ``tool_choice`` /
``function_call`` naming one, ``response_format`` other than text, ``prediction``, ``reasoning_effort``,
``verbosity``, ``web_search_options``, ``moderation``. Taken and without effect on the answer (OpenAI's
bookkeeping): ``user``, ``metadata``, ``store``, ``service_tier``, ``safety_identifier``,
``prompt_cache_*``, ``parallel_tool_calls``. Extensions of ours: ``priority`` (``control``,
``interactive``, ``batch``: the request's class in the runtime, docs/scheduling.md; default
interactive); a model's own ``think`` (bool; BAGEL, a model with ``chat_think``): the model reasons
before it answers, and the reply carries the reasoning apart (``reasoning_content``,
mstar_ros.webrtc.reasoning_split); refused (400) by a model that cannot. Any other field: 400.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mstar.priority import Priority
from mstar.sampling_params import SamplingParams
from mstar_ros.webrtc.openai_errors import APIError, check_range

AUDIO_FORMATS = ("wav", "aac", "mp3", "flac", "opus", "pcm16")


class AudioSpec(msgspec.Struct, forbid_unknown_fields=True):
    voice: str | dict[str, Any] | None = None
    format: str = "pcm16"


class StreamOptions(msgspec.Struct, forbid_unknown_fields=False):  # include_obfuscation: ours has no padding
    include_usage: bool | None = None


class ChatBody(msgspec.Struct, forbid_unknown_fields=True):
    messages: list[dict[str, Any]]
    model: str | None = None
    modalities: list[str] | None = None
    audio: AudioSpec | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    think: bool | None = None  # a model's extension (``chat_think``): reason first, as BAGEL's think mode
    # refused unless off
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    stop: str | list[str] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    moderation: Any = None
    # taken, without effect on the answer
    parallel_tool_calls: bool | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    # ours: the request's priority class (mstar.priority); None: the model's default (interactive)
    priority: str | None = None


def _unsupported(param: str, what: str) -> APIError:
    return APIError(400, f"Unsupported parameter: '{param}' {what}", param=param, code="unsupported_parameter")


def _unsupported_value(param: str, value: Any, what: str) -> APIError:
    return APIError(
        400,
        f"Unsupported value: '{param}' does not support {value!r} here: {what}",
        param=param,
        code="unsupported_value",
    )


def check_chat_params(body: ChatBody, model=None) -> None:
    """An APIError naming the first field this server (serving ``model``) cannot honour as asked."""
    if body.priority is not None:
        try:
            Priority.parse(body.priority)
        except ValueError as exc:
            raise APIError(400, str(exc), param="priority", code="invalid_value") from None
    if body.think and not getattr(model, "chat_think", False):
        raise _unsupported("think", "is not supported: this model has no think mode")
    if body.n is not None:
        check_range("n", body.n, 1)
        if body.n > 1:
            raise _unsupported_value("n", body.n, "this server makes one choice per request")
    if body.temperature is not None:
        check_range("temperature", body.temperature, 0, 2)
    if body.top_p is not None:
        check_range("top_p", body.top_p, 0, 1)
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(body, name)
        if value is not None:
            check_range(name, value, -2, 2)
            if value != 0:
                raise _unsupported_value(name, value, "the model's sampling has no such penalty")
    for name in ("max_tokens", "max_completion_tokens"):
        if getattr(body, name) is not None:
            check_range(name, getattr(body, name), 1)
    if body.logprobs:
        raise _unsupported_value("logprobs", True, "this server returns no log probabilities")
    if body.top_logprobs is not None:
        raise _unsupported("top_logprobs", "is not supported: this server returns no log probabilities")
    if body.logit_bias:
        raise _unsupported("logit_bias", "is not supported by the model's sampling")
    if body.stop:
        raise _unsupported("stop", "is not supported: the reply ends where the model ends it, or at max_tokens")
    for name in ("tools", "functions"):
        if getattr(body, name):
            raise _unsupported(name, "is not supported: the model calls no tools")
    for name in ("tool_choice", "function_call"):
        value = getattr(body, name)
        if value not in (None, "none", "auto"):
            raise _unsupported_value(name, value, "the model calls no tools")
    kind = (body.response_format or {}).get("type", "text")
    if kind != "text":
        raise _unsupported_value("response_format", kind, "only text; the model cannot be held to a format")
    for name in ("prediction", "reasoning_effort", "verbosity", "web_search_options", "moderation"):
        if getattr(body, name) is not None:
            raise _unsupported(name, "is not supported by this model")
    modalities = body.modalities or ["text"]
    if not set(modalities) <= {"text", "audio"} or "text" not in modalities:
        raise _unsupported_value("modalities", modalities, 'use ["text"] or ["text", "audio"]')
    if body.audio is not None:
        if body.audio.format not in AUDIO_FORMATS:
            raise APIError(
                400,
                f"audio.format {body.audio.format!r}: one of {', '.join(AUDIO_FORMATS)}",
                param="audio.format",
                code="invalid_value",
            )
        if body.stream and body.audio.format != "pcm16":
            raise _unsupported_value("audio.format", body.audio.format, "a streamed reply's audio is pcm16")


def text_sampling(body: ChatBody, sampling: SamplingParams) -> SamplingParams:
    """The text's sampling with the request's ``temperature`` and ``top_p`` (``top_p`` 0: only the most
    likely token, which is greedy)."""
    changes: dict[str, Any] = {}
    if body.temperature is not None:
        changes["temperature"] = float(body.temperature)
    if body.top_p is not None:
        if body.top_p == 0:
            changes["temperature"] = 0.0
        else:
            changes["top_p"] = float(body.top_p)
    return msgspec.structs.replace(sampling, **changes) if changes else sampling
