"""An image edit's request (``/v1/images/edits``) read and judged: its fields (multipart, url-encoded or
JSON) and its input images (``image`` / ``image[]`` files, or ``images: [{"image_url": "data:..."}]``)
opened by their headers, every refusal an APIError naming its field; then, once their pixels are
reserved, decoded to HWC uint8 RGB.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from aiohttp import web

from mstar_ros.webrtc.http_guard import request_body
from mstar_ros.webrtc.image_extensions import decode_with_options, take_form_options
from mstar_ros.webrtc.image_params import EditBody
from mstar_ros.webrtc.media_parts import (
    MAX_REQUEST_IMAGE_PIXELS,
    BadRequest,
    load_image,
    open_image,
    open_image_bytes,
)
from mstar_ros.webrtc.multipart_form import BadForm, read_form
from mstar_ros.webrtc.openai_errors import APIError, param_of

IMAGE_FILE_FIELDS = ("image", "image[]")
FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


async def read_edit(http: web.Request, model, model_name: str) -> tuple[EditBody, list, dict[str, Any]]:
    """The body's fields, its input images opened (headers read, judged; no pixel decoded): [(PIL image,
    the field it came in)], and the model's own options (mstar_ros.webrtc.image_extensions). ``model``
    (served as ``model_name``) says what it takes."""
    raw = await request_body(http)
    budget = [MAX_REQUEST_IMAGE_PIXELS]
    if http.content_type in FORMS:
        try:
            form = await read_form(raw, http.headers.get("Content-Type", ""))
        except BadForm as exc:
            raise APIError(400, str(exc), code="invalid_request_body") from None
        unknown = [name for name, _ in form.files if name not in (*IMAGE_FILE_FIELDS, "mask")]
        if unknown:
            raise APIError(400, f"unknown file field {unknown[0]!r}", param=unknown[0], code="unknown_parameter")
        options = take_form_options(form.fields, model)
        try:
            body = msgspec.convert(form.fields, EditBody, strict=False)
        except msgspec.ValidationError as exc:
            raise APIError(
                400, f"bad request body: {exc}", param=param_of(str(exc)), code="invalid_request_body"
            ) from None
        if body.image is not None or body.images is not None:
            raise APIError(400, "image must be a file part, not text", param="image", code="invalid_value")
        files = [(data, name) for name, data in form.files if name in IMAGE_FILE_FIELDS]
        mask = next((data for name, data in form.files if name == "mask"), None) or body.mask
        _check_inputs(model, model_name, len(files), mask)
        return body, [_open(data, name, budget) for data, name in files], options
    body, options = decode_with_options(raw, EditBody, model)
    urls = _json_images(body)
    _check_inputs(model, model_name, len(urls), body.mask)
    return body, [_open(url, field, budget) for url, field in urls], options


def _json_images(body: EditBody) -> list[tuple[Any, str]]:
    """(data URL, its field) of each input image of a JSON edit: ``images: [{"image_url": ...}]``, or
    ``image``: a data URL or a list of them."""
    if body.images is not None and body.image is not None:
        raise APIError(400, "give images or image, not both", param="images", code="invalid_value")
    if body.images is not None:
        urls = []
        for i, item in enumerate(body.images):
            field = f"images[{i}]"
            if isinstance(item, dict) and "file_id" in item:
                raise APIError(
                    400, "file_id: this server keeps no files; send image_url", param=field, code="invalid_value"
                )
            url = item.get("image_url") if isinstance(item, dict) else None
            if isinstance(url, dict):  # {"image_url": {"url": ...}}, as chat parts have it
                url = url.get("url")
            if not isinstance(url, str):
                raise APIError(400, f'{field} must be {{"image_url": "data:..."}}', param=field, code="invalid_value")
            urls.append((url, field))
        return urls
    if isinstance(body.image, str):
        return [(body.image, "image")]
    if isinstance(body.image, list):
        return [(url, f"image[{i}]") for i, url in enumerate(body.image)]
    return []


def _check_inputs(model, model_name: str, count: int, mask) -> None:
    if mask is not None and not getattr(model, "image_mask", False):
        raise APIError(
            400,
            f"{model_name} takes no mask: its edits follow the prompt",
            param="mask",
            code="unsupported_parameter",
        )
    if count == 0:
        raise APIError(400, "an edit needs an input image (image)", param="image", code="missing_required_parameter")
    most = int(getattr(model, "max_input_images", 1))
    if count > most:
        raise APIError(
            400, f"{count} input images: this model takes at most {most}", param="image", code="invalid_value"
        )


def _open(data, field: str, budget: list[int]):
    try:
        image = open_image(data, budget) if isinstance(data, str) else open_image_bytes(data, budget)
    except BadRequest as exc:
        raise APIError(400, f"{field}: {exc}", param=field, code="invalid_image") from None
    return image, field


def decode_inputs(opened: list) -> list[np.ndarray]:
    """The opened input images decoded (reserve their pixels first), HWC uint8 RGB each."""
    arrays = []
    for image, field in opened:
        try:
            load_image(image)
        except BadRequest as exc:
            raise APIError(400, f"{field}: {exc}", param=field, code="invalid_image") from None
        arrays.append(_rgb(image))
    return arrays


def _rgb(image) -> np.ndarray:
    """A decoded PIL image -> HWC uint8 RGB (alpha and palettes flattened)."""
    return np.asarray(image.convert("RGB"), dtype=np.uint8)
