"""session.update read from OpenAI's GA shape and its beta one: what it changes, and an error naming each
field the gateway does not serve."""

from __future__ import annotations

import pytest

from mstar_ros.webrtc.events import EventError
from mstar_ros.webrtc.session_update import UNSET, session_change

VOICES = ("tara", "leah")


def check_voice(voice, field):
    found = next((v for v in VOICES if v == str(voice).lower()), None)
    if found is None:
        raise ValueError(f"{field} {voice!r}: this model has no such voice")
    return found


def change(session, *, instructions=True, microphone=True):
    return session_change(
        session,
        model_name="orpheus",
        takes_instructions=instructions,
        has_microphone=microphone,
        check_voice=check_voice,
        max_tokens_limit=1200,
    )


def test_the_ga_shape_sets_voice_instructions_turn_detection_and_length():
    got = change(
        {
            "type": "realtime",
            "model": "orpheus",
            "instructions": "  Be brief.  ",
            "output_modalities": ["audio"],
            "max_output_tokens": "inf",
            "tools": [],
            "tool_choice": "auto",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": None,
                    "turn_detection": {
                        "type": "server_vad",
                        "silence_duration_ms": 700,
                        "threshold": 0.6,
                        "prefix_padding_ms": 300,
                        "create_response": True,
                        "interrupt_response": True,
                    },
                },
                "output": {"voice": "Leah", "speed": 1.0, "format": {"type": "audio/pcm"}},
            },
        }
    )
    assert (got.voice, got.instructions, got.silence_duration_ms, got.vad_threshold) == ("leah", "Be brief.", 700, 0.6)
    assert got.sampling == {"max_tokens": 1200} and not got.turn_detection_off


def test_the_beta_shape_and_what_a_client_sends_back_as_it_got_it():
    got = change(
        {
            "voice": "tara",
            "modalities": ["text", "audio"],
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "max_response_output_tokens": 50,
            "seed": 3,
            "temperature": 0.5,
            "id": "webrtc:x",
            "object": "realtime.session",
            "input_image": False,
        }
    )
    assert (got.voice, got.sampling, got.instructions) == (
        "tara",
        {"max_tokens": 50, "seed": 3, "temperature": 0.5},
        UNSET,
    )
    assert change({"instructions": None}).instructions is None  # null drops them


@pytest.mark.parametrize(
    "session, param",
    [
        ({"type": "transcription"}, "session.type"),
        ({"model": "gpt-realtime"}, "session.model"),
        ({"output_modalities": ["text"]}, "session.output_modalities"),
        ({"audio": {"output": {"voice": "alloy"}}}, None),  # the voice check's own error, naming its field
        ({"audio": {"output": {"speed": 1.5}}}, "session.audio.output.speed"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format"),
        ({"audio": {"input": {"transcription": {"model": "whisper-1"}}}}, "session.audio.input.transcription"),
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}, "session.audio.input.turn_detection.type"),
        (
            {"audio": {"input": {"turn_detection": {"create_response": False}}}},
            "session.audio.input.turn_detection.create_response",
        ),
        ({"audio": {"input": {"turn_detection": None}}}, "session.audio.input.turn_detection"),  # it has a microphone
        ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
        ({"max_output_tokens": 5000}, "session.max_output_tokens"),
        ({"temperature": "hot"}, "session.temperature"),
        ({"frobnicate": 1}, "session.frobnicate"),
        ({"audio": {"output": {"pitch": 2}}}, "session.audio.output.pitch"),
    ],
)
def test_each_field_not_served_is_an_error_naming_it(session, param):
    with pytest.raises(ValueError) as refused:
        change(session)
    if param is None:
        assert "session.audio.output.voice 'alloy'" in str(refused.value)
    else:
        assert isinstance(refused.value, EventError) and refused.value.param == param, refused.value
        assert param in str(refused.value)


def test_instructions_to_a_model_that_only_speaks_and_turn_detection_off_without_a_microphone():
    with pytest.raises(EventError, match="takes no instructions") as refused:
        change({"instructions": "Be brief."}, instructions=False)
    assert refused.value.param == "session.instructions"
    assert change({"turn_detection": None}, microphone=False).turn_detection_off
