"""Splitting an offer into the m-sections aiortc answers and those rejected with port 0, on SDP built here."""

from __future__ import annotations

import pytest

from mstar_ros.webrtc.sdp_sections import BadSDP, split_offer

TRANSPORT = [
    "a=ice-ufrag:abcd",
    "a=ice-pwd:0123456789abcdefghijkl",
    "a=fingerprint:sha-256 AA:BB",
    "a=setup:actpass",
    "a=rtcp-mux",
    "a=candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host",
    "a=end-of-candidates",
]


def offer(video_first: bool = True) -> str:
    video = [
        "m=video 9 UDP/TLS/RTP/SAVPF 96 97",
        "c=IN IP4 0.0.0.0",
        "a=mid:v",
        "a=sendonly",
        "a=rtpmap:96 VP8/90000",
        "a=rtpmap:97 rtx/90000",
        "a=fmtp:97 apt=96",
    ]
    audio = [
        "m=audio 0 UDP/TLS/RTP/SAVPF 111",
        "c=IN IP4 0.0.0.0",
        "a=mid:a",
        "a=bundle-only",
        "a=sendrecv",
        "a=rtpmap:111 opus/48000/2",
    ]
    video, audio = (video + TRANSPORT, audio) if video_first else (video, audio + TRANSPORT)
    media = video + audio if video_first else audio + video
    order = "v a" if video_first else "a v"
    return "\r\n".join(["v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0", f"a=group:BUNDLE {order}", *media]) + "\r\n"


def test_a_rejected_bundle_tag_hands_its_transport_to_the_first_section_kept():
    split = split_offer(offer(), frozenset({"audio"}))
    assert split.rejected_mids == ["v"]
    sent = split.offer_for_aiortc()
    assert "m=video" not in sent and "a=group:BUNDLE a\r\n" in sent and "a=bundle-only" not in sent
    audio = sent[sent.index("m=audio") :]
    assert all(line in audio for line in TRANSPORT)


def test_the_answer_puts_the_rejected_section_back_in_its_place_with_port_0():
    split = split_offer(offer(), frozenset({"audio"}))
    aiortc_answer = "v=0\r\ns=-\r\na=group:BUNDLE a\r\nm=audio 5000 UDP/TLS/RTP/SAVPF 111\r\na=mid:a\r\n"
    answer = split.answer(aiortc_answer)
    sections = answer.split("\r\nm=")
    assert sections[1].split("\r\n") == [
        "video 0 UDP/TLS/RTP/SAVPF 96",
        "c=IN IP4 0.0.0.0",
        "a=inactive",
        "a=mid:v",
        "a=rtpmap:96 VP8/90000",
    ]
    assert sections[2].startswith("audio 5000 ") and "a=group:BUNDLE a\r\n" in answer


def test_an_offer_with_only_kept_sections_passes_unchanged_and_a_formatless_m_line_is_refused():
    split = split_offer(offer(video_first=False), frozenset({"audio", "video"}))
    assert split.rejected_mids == [] and split.offer_for_aiortc() == offer(video_first=False)
    bad = split_offer("v=0\r\nm=video 9 RTP/AVP\r\na=mid:0\r\nm=audio 9 RTP/AVP 0\r\n", frozenset({"audio"}))
    with pytest.raises(BadSDP, match="has no format"):
        bad.answer("v=0\r\nm=audio 9 RTP/AVP 0\r\n")
