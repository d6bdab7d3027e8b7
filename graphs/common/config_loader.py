"""A checkpoint's ``config.json`` read into msgspec structs, with errors that name the file and the bad field.

Every model's config reads through here, so a front end catches one :class:`ConfigError` whatever the
model, and every message reads ``<file>: <field path>: <what is wrong>``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

FieldError = Callable[[str, str], "ConfigError"]

DTYPE_NAMES = ("float32", "float16", "bfloat16")


class ConfigError(ValueError):
    """A config.json that is unreadable, mistyped, or describes an impossible model."""


class JsonConfig:
    """``from_dir`` and ``from_dict`` for a config struct (a mixin of ``msgspec.Struct``) that defines
    ``from_json(data, *, source)``; ``checkpoint`` names what a directory holding it is."""

    __slots__ = ()
    checkpoint = "a checkpoint directory"

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "config.json") -> Any:
        raise NotImplementedError

    @classmethod
    def from_dir(cls, path: str | Path) -> Any:
        """Read ``<path>/config.json`` (or ``path`` itself if it names a file)."""
        file = config_file(path, f"{cls.checkpoint} with config.json")
        return cls.from_json(file.read_bytes(), source=str(file))

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> Any:
        return cls.from_json(msgspec.json.encode(data), source=source)


def config_file(path: str | Path, expected: str) -> Path:
    """``<path>/config.json``, or ``path`` itself if it names a file; ``expected`` says what the
    missing file's directory should have been ("a pi0.5 checkpoint directory with config.json")."""
    path = Path(path)
    file = path if path.is_file() else path / "config.json"
    if not file.is_file():
        raise ConfigError(f"{file}: no such file (expected {expected})")
    return file


def decode_json(data: bytes | str, kind: type[T], source: str) -> T:
    """JSON text -> ``kind``; a malformed or mistyped file is a ConfigError naming ``source`` and the field."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {field_message(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc}") from None


def convert(data: Any, kind: type[T], source: str, where: str = "") -> T:
    """Decoded JSON (or builtins) -> ``kind``; ``where`` is the field path ``data`` sits at."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_join(where, field_message(str(exc)))}") from None


def field_error(source: str) -> FieldError:
    """``bad(field, why)`` -> the ConfigError ``"<source>: <field>: <why>"`` (validators raise it)."""

    def bad(field: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: {field}: {why}")

    return bad


def require_positive(bad: FieldError, obj: object, fields: tuple[str, ...], prefix: str = "") -> None:
    """Each named field of ``obj`` is > 0."""
    for field in fields:
        value = getattr(obj, field)
        if value <= 0:
            raise bad(_join(prefix, field, "."), f"must be > 0, got {value}")


def require_finite_positive(bad: FieldError, obj: object, fields: tuple[str, ...], prefix: str = "") -> None:
    """Each named field of ``obj`` is a finite number > 0 (epsilons, RoPE thetas, periods)."""
    for field in fields:
        value = getattr(obj, field)
        if not (value > 0 and math.isfinite(value)):
            raise bad(_join(prefix, field, "."), f"must be a finite number > 0, got {value}")


def require_divides(bad: FieldError, field: str, divisor: int, of: str, value: int) -> None:
    """``divisor`` (the value of ``field``) divides ``value`` (that of ``of``), e.g. KV heads into heads."""
    if value % divisor:
        raise bad(field, f"{divisor} does not divide {of}={value}")


def require_dtype(bad: FieldError, field: str, name: str | None) -> None:
    """A checkpoint's stored dtype name, when it gives one, is one we can load."""
    if name is not None and name not in DTYPE_NAMES:
        raise bad(field, f"expected float32, float16 or bfloat16, got {name!r}")


_LOCATED = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`(?: - at `\$(?P<path>[^`]*)`)?$")


def field_message(text: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.hidden_size`" -> "hidden_size: Expected `int`, got `str`";
    "Object missing required field `width` - at `$.vision`" -> "vision.width: missing required field"."""
    missing = _MISSING.match(text)
    if missing:
        return (
            f"{_join((missing.group('path') or '').lstrip('.'), missing.group('field'), '.')}: missing required field"
        )
    located = _LOCATED.match(text)
    if located:
        return _join(located.group("path").lstrip("."), located.group("msg"))
    return text


def _join(where: str, what: str, sep: str = ": ") -> str:
    return f"{where}{sep}{what}" if where else what
