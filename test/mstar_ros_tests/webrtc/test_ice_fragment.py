"""Trickle ICE SDP fragments (RFC 8840) as WHIP clients PATCH them, parsed; bad ones name what is wrong."""

from __future__ import annotations

import pytest

from mstar_ros.webrtc.ice_fragment import BadFragment, offer_ufrag, parse_fragment


def test_a_fragment_gives_its_credentials_candidates_and_end():
    body = "\r\n".join(
        [
            "a=ice-options:trickle ice2",
            "a=group:BUNDLE 0",
            "m=audio 9 UDP/TLS/RTP/SAVPF 111",
            "a=mid:0",
            "a=ice-ufrag:EsAw",
            "a=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1",
            "a=candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host generation 0",
            "a=end-of-candidates",
            "",
        ]
    )
    fragment = parse_fragment(body)
    assert fragment.ufrag == "EsAw" and fragment.end
    assert fragment.candidates == ["1387637174 1 udp 2122260223 192.0.2.1 61764 typ host generation 0"]
    assert offer_ufrag("v=0\r\nm=audio 9 X 0\r\na=ice-ufrag:Zz9\r\n") == "Zz9"


@pytest.mark.parametrize(
    "body, message",
    [
        ("", "empty"),
        ("a=candidate:1 1 udp 1 127.0.0.1 9 typ host\r\nnot sdp\r\n", "not an SDP line: 'not sdp'"),
        ("a=ice-ufrag:one\r\nm=audio 9 X 0\r\na=ice-ufrag:two\r\n", "two ice-ufrag"),
    ],
)
def test_a_bad_fragment_says_what_is_wrong(body, message):
    with pytest.raises(BadFragment, match=message):
        parse_fragment(body)
