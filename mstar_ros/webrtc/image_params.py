"""What ``/v1/images/generations`` and ``/v1/images/edits`` take: every field of OpenAI's request either
honoured or refused with a 400 naming it (``param``), never silently dropped.

Honoured: ``prompt`` (required, up to 32000 characters), ``model``, ``n`` (1-10, and at most the model's
``max_images_per_request``), ``size`` (``auto`` or ``WIDTHxHEIGHT``; the model says which sizes it can
make), ``output_format`` (png, jpeg, webp), ``output_compression`` (0-100, jpeg and webp), ``stream``
and ``partial_images`` (0-3), ``response_format`` ``b64_json`` (``url`` is refused: this server keeps
no files), ``background`` ``auto`` / ``opaque`` (the images are opaque RGB), ``quality`` ``auto``; our
extensions ``seed`` (the same seed gives the same images) and ``steps`` (the model's flow steps).
Edits also take ``image`` / ``image[]`` (multipart files) or ``images`` (JSON: ``[{"image_url":
"data:..."}]``) and ``mask`` where the model takes masks. Taken without effect: ``user``,
``safety_identifier``, ``moderation``. Refused unless absent: ``style``, ``complexity``,
``frame_count``, ``frame_duration_ms``, ``svg``, ``input_fidelity``, ``quality`` other than auto.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mstar_ros.webrtc.image_encoding import OUTPUT_FORMATS
from mstar_ros.webrtc.image_models import MAX_IMAGES_PER_REQUEST, MAX_PARTIAL_IMAGES, parse_size
from mstar_ros.webrtc.openai_errors import APIError, check_range

MAX_PROMPT_CHARS = 32_000  # OpenAI's limit for the GPT image models
MAX_STEPS = 1000


class GenerationBody(msgspec.Struct, forbid_unknown_fields=True):
    prompt: str
    model: str | None = None
    n: int | None = None
    size: str | None = None
    output_format: str | None = None
    output_compression: int | None = None
    response_format: str | None = None
    background: str | None = None
    quality: str | None = None
    stream: bool | None = None
    partial_images: int | None = None
    seed: int | None = None  # our extension
    steps: int | None = None  # our extension
    # taken, without effect
    moderation: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    # refused unless absent
    style: str | None = None
    complexity: str | None = None
    frame_count: int | None = None
    frame_duration_ms: int | None = None
    svg: Any = None


class EditBody(GenerationBody, forbid_unknown_fields=True):
    images: list[Any] | None = None  # JSON: [{"image_url": "data:..."}]
    image: Any = None  # JSON: a data URL, or a list of them (multipart files come apart from the body)
    mask: Any = None
    input_fidelity: str | None = None


def _unsupported_value(param: str, value: Any, what: str) -> APIError:
    return APIError(
        400,
        f"Unsupported value: '{param}' does not support {value!r} here: {what}",
        param=param,
        code="unsupported_value",
    )


def _invalid(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def check_image_params(body: GenerationBody, model) -> tuple[int, int] | None:
    """An APIError naming the first field this server cannot honour as asked; else the requested size
    (None: auto)."""
    if not body.prompt.strip():
        raise _invalid("prompt", "prompt is empty")
    if len(body.prompt) > MAX_PROMPT_CHARS:
        raise APIError(
            400,
            f"Invalid 'prompt': string too long. Expected a string with maximum length {MAX_PROMPT_CHARS}, but "
            f"got a string with length {len(body.prompt)} instead.",
            param="prompt",
            code="string_above_max_length",
        )
    if body.n is not None:
        check_range("n", body.n, 1, MAX_IMAGES_PER_REQUEST)
        most = int(getattr(model, "max_images_per_request", 1))
        if body.n > most:
            raise _unsupported_value("n", body.n, f"this model makes at most {most} images per request")
    try:
        size = parse_size(body.size)
    except ValueError as exc:
        raise _invalid("size", str(exc)) from None
    fmt = body.output_format or "png"
    if fmt not in OUTPUT_FORMATS:
        raise _invalid("output_format", f"output_format {fmt!r}: one of {', '.join(OUTPUT_FORMATS)}")
    if body.output_compression is not None:
        check_range("output_compression", body.output_compression, 0, 100)
        if fmt == "png":
            raise _unsupported_value("output_compression", body.output_compression, "only jpeg and webp are compressed")
    if body.response_format == "url":
        raise _unsupported_value("response_format", "url", "this server keeps no files: images come as b64_json")
    if body.response_format not in (None, "b64_json"):
        raise _invalid("response_format", f"response_format {body.response_format!r}: b64_json")
    if body.background not in (None, "auto", "opaque"):
        raise _unsupported_value("background", body.background, "the images are opaque (auto or opaque)")
    if body.quality not in (None, "auto"):
        raise _unsupported_value("quality", body.quality, "auto only; the model's `steps` set its effort")
    if body.partial_images is not None:
        check_range("partial_images", body.partial_images, 0, MAX_PARTIAL_IMAGES)
    if body.steps is not None:
        check_range("steps", body.steps, 1, MAX_STEPS)
    for name in ("style", "complexity", "frame_count", "frame_duration_ms", "svg", "input_fidelity"):
        if getattr(body, name, None) is not None:
            raise APIError(
                400,
                f"Unsupported parameter: '{name}' is not supported by this model",
                param=name,
                code="unsupported_parameter",
            )
    return size
