"""The image capability a served model may have: what the gateway (``/v1/images/generations``,
``/v1/images/edits``) and ``mstar-ros bagel`` need of a model that makes images. No per-model code.

A model object has the capability when ``image_generation`` or ``image_edit`` is true; it then offers:

- ``image_generation: bool``: it makes images from a prompt alone (``/v1/images/generations``).
- ``image_edit: bool``: it makes images from a prompt and input images (``/v1/images/edits``).
- ``image_mask: bool`` (optional, default False): it takes an edit's mask; without it a mask is refused.
- ``max_images_per_request: int``: the most images one request may ask for (``n``; the gateway also caps
  it at OpenAI's 10).
- ``max_input_images: int`` (optional, default 1): the most input images an edit may give.
- ``default_image_steps: int`` (optional): the flow steps a request makes when it names none (shown by
  the CLI).
- ``image_size(size: tuple[int, int] | None, inputs: list[tuple[int, int]]) -> tuple[int, int]``: the
  (width, height) every output of a request will have, for a requested ``size`` (None: "auto", the model
  chooses) and its input images' (width, height) (empty for a generation). Raises ValueError with a
  message saying what sizes it takes (multiples of 16 within bounds, say) when it cannot make ``size``.
  Called before any pixel is decoded (the gateway reserves the outputs' pixels from it).
- ``async generate_images(conductor, *, prompt: str, images: list[np.ndarray], size: tuple[int, int],
  n: int, seed: int | None, steps: int | None, partial_images: int, request_id: str)
  -> AsyncIterator[ImageEvent]``: runs the work as the model's own Walk Graph requests on ``conductor``
  (request ids derived from ``request_id``, e.g. ``f"{request_id}-{i}"``: unique per call) and yields
  ``ImageEvent`` s as they come. ``images``: the input images, HWC uint8 RGB (empty for a generation);
  ``size``: what ``image_size`` returned; ``n``: 1..max_images_per_request images from the same inputs
  (with a ``seed``, image i is seeded from ``seed + i``; the same arguments give the same images);
  ``steps``: the flow steps (None: the model's default); ``partial_images``: 0..3 previews to send per
  image before its final one (it may send fewer). It yields exactly one ``final`` event per index
  0..n-1, ``partial`` events (partial_index 0, 1, ... per image) only before that image's final one, and
  ``progress`` events (no image) as steps are done, which the CLI shows as a bar and the gateway uses to
  notice a client gone. A ValueError raised before the first event is a refusal of the request (the
  gateway answers 400 with its message); any later exception fails the request (500, or an SSE
  ``error`` event). When the consumer stops early (``aclose()``, or the task is cancelled: a client
  that went away), the generator must cancel every Conductor request it still has in flight
  (``await conductor.cancel(id)`` in a ``finally``) so their KV and queued calls are freed.
- ``random_weights: bool`` (optional): the weights are random (said in /v1/models and by the CLI).
- ``image_options: tuple[str, ...]`` (optional): the model's own request fields (BAGEL: ``guidance``,
  ``think``). The gateway takes them out of a request (mstar_ros.webrtc.image_extensions) and passes
  them, when any is given, as ``generate_images(..., options={name: value})``; the model judges them. A
  refusal's ValueError may carry ``param`` (the field, e.g. ``guidance.text_scale``): the 400 names it.
- A ``final`` ImageEvent's ``revised_prompt`` (optional): text the model made the image from beyond the
  prompt (BAGEL's thought in think mode), returned as OpenAI's ``revised_prompt``.

A model that answers in text (``conversational``) and does not speak (no ``audio_output``) offers what
``/v1/chat/completions`` and ``mstar-ros bagel ask`` use: ``text_output`` (the graph output carrying
token ids), ``decode_text(ids) -> str``, ``default_sampling`` (a SamplingParams), ``image_input: bool``
(takes ``image_url`` parts), optionally ``check_images(images)`` (PIL images opened, not decoded:
ValueError when they do not fit) and ``special_token_ids`` (``{"image": id, "end": id}``), and
``request(text, *, audio=None, images=[PIL images or HWC uint8 arrays], history=[(role, text) or
(role, text, None, images)], voice=None, sampling=SamplingParams, outputs=frozenset({text_output}),
speak=False) -> Request`` (``request_id`` optional). Every served model has ``graph()`` and
``modules()`` (the Conductor that serves it is built from them) and may have ``worker_spec()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

import numpy as np

from mstar_graphs.common.image_events import EventKind, ImageEvent  # noqa: F401 - the protocol's event

MAX_IMAGES_PER_REQUEST = 10  # OpenAI's limit on `n`
MAX_PARTIAL_IMAGES = 3  # OpenAI's limit on `partial_images`


@runtime_checkable
class ImageModel(Protocol):
    """What a model that makes images offers (see the module docstring for each member's contract)."""

    image_generation: bool
    image_edit: bool
    max_images_per_request: int

    def image_size(self, size: tuple[int, int] | None, inputs: list[tuple[int, int]]) -> tuple[int, int]: ...

    def generate_images(
        self,
        conductor,
        *,
        prompt: str,
        images: list[np.ndarray],
        size: tuple[int, int],
        n: int,
        seed: int | None,
        steps: int | None,
        partial_images: int,
        request_id: str,
    ) -> AsyncIterator[ImageEvent]: ...


def makes_images(model) -> bool:
    """Whether ``model`` has the image capability (generation or edits)."""
    return bool(getattr(model, "image_generation", False) or getattr(model, "image_edit", False))


def speaks(model) -> bool:
    """Whether ``model`` makes audio (a speech model: ``audio_output``)."""
    return getattr(model, "audio_output", None) is not None


def check_image_model(model, name: str) -> None:
    """A TypeError naming what an image-capable ``model`` (served as ``name``) lacks."""
    for attr in ("max_images_per_request", "image_size", "generate_images", "graph", "modules"):
        if not hasattr(model, attr):
            raise TypeError(f"image model {name!r} lacks {attr!r}")


def check_text_model(model, name: str) -> None:
    """A TypeError naming what a conversational ``model`` that answers in text only lacks."""
    for attr in ("text_output", "decode_text", "default_sampling", "request", "graph", "modules"):
        if not hasattr(model, attr):
            raise TypeError(f"conversational model {name!r} lacks {attr!r}")


def parse_size(size: str | None, field: str = "size") -> tuple[int, int] | None:
    """``"WxH"`` -> (W, H); ``"auto"`` or None -> None; a ValueError naming ``field`` otherwise."""
    if size is None or size == "auto":
        return None
    width, sep, height = str(size).lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) < 1 or int(height) < 1:
        raise ValueError(f"{field} {size!r}: 'auto' or WIDTHxHEIGHT in pixels, e.g. '1024x1024'")
    return int(width), int(height)
