"""What a model that makes images yields while it works: progress, partial images, the final images.

The event type of the image capability (mstar_ros.webrtc.image_models says the whole protocol): a model
folder yields these and a front-end consumes them, so the type lives below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

EventKind = Literal["progress", "partial", "final"]


@dataclass(frozen=True)
class ImageEvent:
    """One step of a request's images. ``index``: which of the ``n`` images (0-based). ``image``: HWC
    uint8 RGB for ``partial`` and ``final`` events, None for ``progress``. ``partial_index``: 0-based
    among this image's partial images. ``step`` / ``steps``: flow steps done of all this image makes
    (0 / 0 where the model does not count them). ``input_tokens`` (of which ``input_image_tokens``
    stood for input images) / ``output_tokens``: on a ``final`` event, what the image cost in the model's
    tokens; the gateway's ``usage`` sums them over a request's final events (0 where the model does not
    say; a prompt shared by the n images is best counted on one of them). ``revised_prompt``: on a
    ``final`` event, text the model made the image from beyond the prompt (BAGEL's thought in think
    mode; the images API returns it as OpenAI's ``revised_prompt``), None otherwise."""

    kind: EventKind
    index: int
    image: np.ndarray | None = None
    partial_index: int = 0
    step: int = 0
    steps: int = 0
    input_tokens: int = 0
    input_image_tokens: int = 0
    output_tokens: int = 0
    revised_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("progress", "partial", "final"):
            raise ValueError(f"ImageEvent kind {self.kind!r}: progress, partial or final")
        if (self.image is None) != (self.kind == "progress"):
            raise ValueError(f"a {self.kind} ImageEvent {'has no' if self.kind == 'progress' else 'needs an'} image")
        image = self.image
        if image is not None and (image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3):
            raise ValueError(f"an ImageEvent's image must be HWC uint8 RGB, got {image.dtype} {tuple(image.shape)}")
