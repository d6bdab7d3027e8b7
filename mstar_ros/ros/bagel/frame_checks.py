"""What the BAGEL node checks of its inputs, and the goal image it makes of an edit; no ROS here.

Every problem raises mstar_ros.ros.common.convert.ObservationError naming the topic and the field at fault;
the node logs it as an error, counts it and keeps serving.
"""

from __future__ import annotations

import numpy as np

from mstar_ros.ros.common.convert import ObservationError, check_image


def check_frame(msg, *, topic: str, max_side: int) -> None:
    """A camera frame the node can use: a supported encoding, step and data length that fit (see
    check_image), and neither side over ``max_side`` (checked first: no pixel of a huge frame is touched)."""
    for field in ("height", "width"):
        value = int(getattr(msg, field))
        if value > max_side:
            raise ObservationError(f"{topic}: image {field} {value} is over max_image_side {max_side}")
    check_image(msg, topic=topic)


def check_text(text: str, *, topic: str, what: str, max_chars: int) -> str:
    """The stripped text of a question or an instruction (``what``); empty or too long is refused."""
    stripped = text.strip()
    if not stripped:
        raise ObservationError(f"{topic}: data is empty (a {what} is needed)")
    if len(stripped) > max_chars:
        raise ObservationError(f"{topic}: data is {len(stripped)} characters, over max_text_chars {max_chars}")
    return stripped


def goal_pixels(image: np.ndarray, frame_hw: tuple[int, int] | None) -> np.ndarray:
    """The edited ``image`` ([H, W, 3] uint8) at ``frame_hw`` (its source frame's size; PIL bilinear, as the
    model's own transforms resize), or as it is when ``frame_hw`` is None or already its size."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"an edited image must be [H, W, 3] uint8, got {image.shape} {image.dtype}")
    if frame_hw is None or tuple(image.shape[:2]) == tuple(frame_hw):
        return np.ascontiguousarray(image)
    from PIL import Image

    height, width = frame_hw
    return np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR), dtype=np.uint8)
