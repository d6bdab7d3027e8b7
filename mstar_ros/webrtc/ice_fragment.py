"""Trickle ICE SDP fragments (``application/trickle-ice-sdpfrag``, RFC 8840), as WHIP clients PATCH them.

A fragment holds ICE lines only: session-level ``a=ice-ufrag`` / ``a=ice-pwd`` / ``a=ice-options``, then
per media section its ``m=`` line, ``a=mid``, credentials, ``a=candidate`` lines and perhaps
``a=end-of-candidates``. With BUNDLE (WHIP requires it) all candidates belong to the bundle's one
transport, so they are collected together.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class BadFragment(ValueError):
    pass


@dataclass
class IceFragment:
    ufrag: str | None = None  # the credentials it names (a new ufrag: an ICE restart, RFC 8840 §4.4)
    candidates: list[str] = field(default_factory=list)  # each candidate's text after "a=candidate:"
    end: bool = False  # a=end-of-candidates


def parse_fragment(body: str) -> IceFragment:
    fragment = IceFragment()
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    if not lines:
        raise BadFragment("the SDP fragment is empty")
    for line in lines:
        if line[1:2] != "=":
            raise BadFragment(f"not an SDP line: {line[:80]!r}")
        if line.startswith("a=candidate:"):
            fragment.candidates.append(line[len("a=candidate:") :])
        elif line == "a=end-of-candidates":
            fragment.end = True
        elif line.startswith("a=ice-ufrag:"):
            ufrag = line[len("a=ice-ufrag:") :]
            if fragment.ufrag is not None and ufrag != fragment.ufrag:
                raise BadFragment("the fragment names two ice-ufrag values")
            fragment.ufrag = ufrag
    return fragment


def offer_ufrag(sdp: str) -> str | None:
    """The first ``a=ice-ufrag`` of an offer (with BUNDLE, the transport's)."""
    return next(
        (line.strip()[len("a=ice-ufrag:") :] for line in sdp.splitlines() if line.strip().startswith("a=ice-ufrag:")),
        None,
    )
