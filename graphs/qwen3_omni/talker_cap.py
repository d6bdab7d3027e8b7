"""How much audio a reply's text may have: the Talker's frames capped by the text rows it reads.

The reference (transformers' ``generate``; vLLM-Omni's stage config too) stops the Talker only at codec
EOS or after ``talker_max_new_tokens`` = 4096 frames (5.5 minutes), whatever the text; the released
``generation_config.json`` sets nothing. A trained Talker ends soon after the text's ``tts_eos`` row:
served Qwen3-Omni replies in English took 3.1-4.0 frames per text token (vLLM-Omni's logs: 8 -> 32,
31 -> 97, 71 -> 223), and Chinese read aloud from Qwen-tokenized text about 5.6 (MiniCPM-o 4.5's TTS,
vLLM-Omni PR 6215). A Talker that never ends (random weights, or a trained one that misses EOS) ran
the whole 4096. The cap allows 1.8x the slowest of those rates plus 2 s, so a trained reply ends by
itself well before it, with the reference's codes, and a runaway one stops near its text's length.
"""

from __future__ import annotations

FRAMES_PER_TEXT_TOKEN = 10  # 0.8 s of audio per text token (80 ms frames)
SLACK_FRAMES = 25  # 2 s: a short reply's lead-in and trailing silence
FRAME_SECONDS = 0.08  # 12.5 Hz codec frames


def frame_cap(text_tokens: int) -> int:
    """The most audio frames for a reply whose Talker reads ``text_tokens`` text rows: a reply's tokens
    less its last (which never reaches the Talker), or all the tokens of a text to speak."""
    return FRAMES_PER_TEXT_TOKEN * max(0, text_tokens) + SLACK_FRAMES


def step_cap(text_tokens: int) -> int:
    """The Talker's most code-0 samples for that reply: the last one sampled never gets a frame."""
    return frame_cap(text_tokens) + 1


def cap_note(text_tokens: int, frames: int) -> str | None:
    """What to tell a listener whose reply's audio reached its cap; None when the Talker ended it."""
    cap = frame_cap(text_tokens)
    if frames < cap:
        return None
    return (
        f"audio cut at {cap} frames ({cap * FRAME_SECONDS:.1f} s), the cap for {text_tokens} text tokens "
        f"({FRAMES_PER_TEXT_TOKEN} frames per token + {SLACK_FRAMES}): the Talker did not end it"
    )
