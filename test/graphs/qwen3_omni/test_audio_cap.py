"""A reply's audio is capped by its text (talker_cap): a Talker that does not end (random weights) stops at
10 frames per text token + 25 instead of running to 4096 frames, with the codes the reference makes up to
there, on every walk (streamed reply, reply then Talker, text to speech); a request may lift the cap."""

from __future__ import annotations

import asyncio
import logging

import torch

from mstar.conductor import Conductor
from mstar.sampling_params import SamplingParams
from mstar_graphs.qwen3_omni.direct import generate
from mstar_graphs.qwen3_omni.model import Qwen3Omni
from mstar_graphs.qwen3_omni.reference import reference_generate
from mstar_graphs.qwen3_omni.talker_cap import cap_note, frame_cap, step_cap
from support.parity import FP32
from support.qwen3_omni_prompts import TEXT_PROMPT

GREEDY_TALKER = SamplingParams(temperature=0.0, repetition_penalty=1.05)  # the reference's talker_do_sample=False
REPLY = 3  # reply tokens: the last never reaches the Talker, so it reads 2 text rows
TEXT = REPLY - 1


def test_the_cap_grows_with_the_text_and_is_said():
    assert [frame_cap(n) for n in (0, 2, 255)] == [25, 45, 2575] and step_cap(2) == 46
    assert cap_note(2, 44) is None
    assert cap_note(2, 45) == (
        "audio cut at 45 frames (3.6 s), the cap for 2 text tokens "
        "(10 frames per token + 25): the Talker did not end it"
    )


def test_the_cap_cuts_where_the_reference_talks_on_with_its_codes(q3, q3_ref):
    """The reference's Talker, given 10 frames more than the cap, does not end within them; ours, given
    4096, stops at the cap with exactly the reference's first frames."""
    ref = reference_generate(
        q3_ref, TEXT_PROMPT, thinker_max_new_tokens=REPLY, talker_max_new_tokens=step_cap(TEXT) + 10
    )
    ours = generate(
        q3["thinker"],
        q3["talker"],
        q3["code2wav"],
        TEXT_PROMPT,
        thinker_max_new_tokens=REPLY,
        talker_max_new_tokens=4096,
    )
    assert ours.text_ids == ref.text_ids and len(ours.text_ids) == REPLY
    assert ref.codes.shape[1] == frame_cap(TEXT) + 10
    assert ours.codes.shape[1] == frame_cap(TEXT) and torch.equal(ours.codes, ref.codes[:, : frame_cap(TEXT)])


def test_served_audio_stops_at_the_cap_on_every_walk_and_says_so(q3_ckpt, caplog):
    model = Qwen3Omni.load(q3_ckpt, progress=False)
    with torch.inference_mode():
        expected = generate(
            model.thinker,
            model.talker,
            model.code2wav,
            TEXT_PROMPT,
            thinker_max_new_tokens=REPLY,
            talker_max_new_tokens=4096,
        )
    say = expected.text_ids[:TEXT]  # spoken as given: the same text rows as the reply's
    requests = {
        "streamed": model.request(
            TEXT_PROMPT, thinker_max_tokens=REPLY, talker_max_tokens=4096, talker_sampling=GREEDY_TALKER
        ),
        "after reply": model.request(
            TEXT_PROMPT,
            thinker_max_tokens=REPLY,
            talker_max_tokens=4096,
            talker_sampling=GREEDY_TALKER,
            talker_after_reply=True,
        ),
        "spoken text": model.request(TEXT_PROMPT, say_ids=say, talker_max_tokens=4096, talker_sampling=GREEDY_TALKER),
        "no cap": model.request(
            TEXT_PROMPT,
            thinker_max_tokens=REPLY,
            talker_max_tokens=frame_cap(TEXT) + 10,
            talker_sampling=GREEDY_TALKER,
            audio_cap=False,
        ),
    }

    async def main():
        async with Conductor(model.graph(), model.modules(), config=FP32) as c:
            return {name: await c.submit(req).collect() for name, req in requests.items()}

    with caplog.at_level(logging.INFO, logger="mstar_graphs.qwen3_omni"):
        outs = asyncio.run(main())
    frames = {name: torch.stack(out["codes"], dim=1) for name, out in outs.items()}
    for name in ("streamed", "after reply"):
        assert [int(t) for t in outs[name]["text_ids"]] == expected.text_ids
        assert torch.equal(frames[name], expected.codes), name
    assert torch.equal(frames["spoken text"], expected.codes)  # its rows are the reply's
    # lifted, the Talker goes on past the cap: the cap is what stopped the others
    assert frames["no cap"].shape[1] == frame_cap(TEXT) + 9  # the last sampled code 0 gets no frame
    assert torch.equal(frames["no cap"][:, : frame_cap(TEXT)], expected.codes)
    for name in ("streamed", "after reply", "spoken text"):  # said in the output and in the log
        assert [t.tolist() for t in outs[name]["audio_capped"]] == [[frame_cap(TEXT), TEXT]], name
        assert model.audio_cap_note(outs[name]) == cap_note(TEXT, frame_cap(TEXT))
    assert "audio_capped" not in outs["no cap"] and model.audio_cap_note(outs["no cap"]) is None
    assert caplog.text.count(f"Qwen3-Omni Talker: {cap_note(TEXT, frame_cap(TEXT))}") == 3
