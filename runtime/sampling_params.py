"""Per-request sampling parameters, validated with errors that name the field."""

from __future__ import annotations

import msgspec


class SamplingParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """temperature 0 means greedy. ``seed`` fixes sampling (and any node randomness) per request."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_tokens: int = 1200
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            ("temperature", self.temperature >= 0.0, "must be >= 0"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 disables)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("repetition_penalty", self.repetition_penalty > 0.0, "must be > 0"),
            ("max_tokens", self.max_tokens >= 1, "must be >= 1"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"sampling.{name} = {getattr(self, name)!r} {why}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_dict(cls, data: dict) -> SamplingParams:
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"sampling: {exc}") from None
