"""An SDP offer's media sections: those the gateway answers, and those it rejects with port 0 (RFC 3264 §6).

aiortc answers every audio or video m-section it can decode (a video one as recvonly, which the gateway
would never read) and cannot reject one. So aiortc gets the offer without the rejected sections, and
they go back into its answer in their places: port 0, their first format, their mid, and out of the
BUNDLE group (RFC 9143 §7.3.3). Where a rejected section carried the bundle's transport (the offer's
candidates, ICE credentials, DTLS fingerprint), those lines move to the first section kept.
"""

from __future__ import annotations

from dataclasses import dataclass

# the lines of a section that belong to the bundle's one transport, by attribute name
TRANSPORT = (
    "candidate",
    "end-of-candidates",
    "ice-ufrag",
    "ice-pwd",
    "ice-options",
    "fingerprint",
    "setup",
    "rtcp-mux",
    "rtcp-mux-only",
)


class BadSDP(ValueError):
    pass


@dataclass
class Section:
    lines: list[str]  # its m= line first

    @property
    def kind(self) -> str:
        return self.lines[0][2:].split(" ", 1)[0]

    @property
    def mid(self) -> str | None:
        return next((line[6:] for line in self.lines if line.startswith("a=mid:")), None)

    def attributes(self) -> set[str]:
        return {line[2:].split(":", 1)[0] for line in self.lines if line.startswith("a=")}

    def rejected(self) -> list[str]:
        """This section as an answer rejects it: port 0, its first format (SDP wants one) and that
        format's rtpmap / fmtp, so that parsers strict about payload types take it too."""
        parts = self.lines[0].split(" ")
        if len(parts) < 4:
            raise BadSDP(f"m-line {self.lines[0]!r} has no format")
        first = parts[3]
        lines = [f"m={self.kind} 0 {parts[2]} {first}", "c=IN IP4 0.0.0.0", "a=inactive"]
        if self.mid is not None:
            lines.append(f"a=mid:{self.mid}")
        return lines + [line for line in self.lines if line.startswith((f"a=rtpmap:{first} ", f"a=fmtp:{first} "))]


@dataclass
class SplitOffer:
    session: list[str]  # the lines before the first m= line
    sections: list[Section]
    kept: list[bool]  # per section: answered by aiortc (True) or rejected

    @property
    def rejected_mids(self) -> list[str]:
        return [s.mid for s, keep in zip(self.sections, self.kept) if not keep and s.mid is not None]

    def kept_sections(self) -> list[Section]:
        return [s for s, keep in zip(self.sections, self.kept) if keep]

    def offer_for_aiortc(self) -> str:
        kept = [Section(list(s.lines)) for s in self.kept_sections()]
        if kept and self.rejected_mids:
            first, have = kept[0], kept[0].attributes()
            for section in (s for s, keep in zip(self.sections, self.kept) if not keep):
                moved = [
                    line
                    for line in section.lines
                    if line.startswith("a=")
                    and line[2:].split(":", 1)[0] in TRANSPORT
                    and line[2:].split(":", 1)[0] not in have
                ]
                first.lines += moved
                have |= {line[2:].split(":", 1)[0] for line in moved}
            first.lines = [line for line in first.lines if line != "a=bundle-only"]
        session = [_without_mids(line, self.rejected_mids) for line in self.session]
        return _joined(session + [line for s in kept for line in s.lines])

    def answer(self, aiortc_answer: str) -> str:
        """aiortc's answer (to ``offer_for_aiortc``) with the rejected sections back in their places."""
        theirs = split_sections(aiortc_answer)
        answered = iter(theirs.sections)
        lines = list(theirs.session)
        for section, keep in zip(self.sections, self.kept):
            lines += next(answered).lines if keep else section.rejected()
        return _joined(lines)


def split_sections(sdp: str) -> SplitOffer:
    lines = [line for line in sdp.splitlines() if line]
    starts = [i for i, line in enumerate(lines) if line.startswith("m=")]
    sections = [Section(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]
    return SplitOffer(lines[: starts[0]] if starts else lines, sections, [True] * len(sections))


def split_offer(sdp: str, kinds: frozenset[str]) -> SplitOffer:
    """The offer's sections, those of a kind in ``kinds`` kept, the others to reject."""
    offer = split_sections(sdp)
    offer.kept = [s.kind in kinds for s in offer.sections]
    return offer


def _without_mids(line: str, mids: list[str]) -> str:
    if not line.startswith("a=group:BUNDLE") or not mids:
        return line
    items = line.split(" ")
    return " ".join(items[:1] + [mid for mid in items[1:] if mid not in mids])


def _joined(lines: list[str]) -> str:
    return "\r\n".join(lines) + "\r\n"
