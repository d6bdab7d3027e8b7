"""A model's own fields of an image request (``guidance``, ``think`` for BAGEL): the names the model lists
in ``image_options`` are taken out of the request before OpenAI's fields are judged, and passed to the
model whole as ``options``; the model judges them (a ValueError with a ``param`` attribute names the
field). Nothing here knows any model's options.

A JSON body carries them as they are (``{"guidance": {"text_scale": 4}}``, as the OpenAI client's
``extra_body`` sends them). A form carries them flattened as the OpenAI client flattens ``extra_body``
into multipart fields: ``guidance[text_scale]=4``, a list as repeated ``guidance[interval][]``; each
value is read as a JSON scalar where it parses as one (``4``, ``true``), else kept as text.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from mstar_ros.webrtc.openai_errors import APIError, param_of
from mstar_ros.webrtc.openai_http import decode_body

_KEY = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")


def model_options(model) -> tuple[str, ...]:
    return tuple(getattr(model, "image_options", ()) or ())


def take_json_options(data: dict[str, Any], model) -> dict[str, Any]:
    """The model's options taken out of a JSON body (``data`` keeps the rest)."""
    return {name: data.pop(name) for name in model_options(model) if name in data}


def take_form_options(fields: dict[str, Any], model) -> dict[str, Any]:
    """The model's options taken out of a form's fields (``fields`` keeps the rest), unflattened."""
    names = set(model_options(model))
    options: dict[str, Any] = {}
    for key in list(fields):
        match = _KEY.match(key)
        if not match or match.group(1) not in names:
            continue
        value = fields.pop(key)
        path = [match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))]
        if path[-1] == "":  # name[]: a list (repeated fields)
            path.pop()
            value = [_scalar(v) for v in (value if isinstance(value, list) else [value])]
        else:
            value = _scalar(value[-1] if isinstance(value, list) else value)
        _put(options, path, value)
    return options


def decode_with_options(raw: bytes, kind: type, model) -> tuple[Any, dict[str, Any]]:
    """A JSON body as ``kind`` without the model's own options, and those options."""
    if not model_options(model):
        return decode_body(raw, kind), {}
    data = decode_body(raw, dict)
    options = take_json_options(data, model)
    try:
        return msgspec.convert(data, kind), options
    except msgspec.ValidationError as exc:
        raise APIError(
            400, f"bad request body: the body: {exc}", param=param_of(str(exc)), code="invalid_request_body"
        ) from None


def _put(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for name in path[:-1]:
        node = tree.setdefault(name, {})
        if not isinstance(node, dict):  # `guidance=x` and `guidance[a]=y` both given: the object wins
            node = tree[name] = {}
        tree = node
    tree[path[-1]] = value


def _scalar(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if not isinstance(value, (dict, list)) else text
