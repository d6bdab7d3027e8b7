"""Bad input to Qwen3-Omni gets a clear error and leaves the others served."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor
from mstar.request import RequestError
from mstar_graphs.qwen3_omni.audio_features import log_mel
from mstar_graphs.qwen3_omni.frontend import Qwen3OmniChat
from support.parity import FP32


@pytest.fixture(scope="module")
def chat(q3_ckpt):
    return Qwen3OmniChat.load(q3_ckpt, progress=False)


def test_audio_that_cannot_be_a_turn_is_refused_before_any_work(chat):
    with pytest.raises(ValueError, match="over the 300 s limit"):
        log_mel(torch.zeros(16000 * 301))
    with pytest.raises(ValueError, match="at least 400 of them"):
        chat.request(audio=torch.zeros(100))
    with pytest.raises(ValueError, match="NaN or infinite"):
        chat.request(audio=torch.full((16000,), float("nan")))
    with pytest.raises(ValueError, match="an empty turn"):
        chat.request("   ")
    with pytest.raises(ValueError, match="unknown speaker 'nobody'"):
        chat.request("hello", voice="nobody")
    with pytest.raises(ValueError, match="no audio features came with it"):
        chat.model.request([151644, 872, 198, 151675, 151645, 198, 151644, 77091, 198])
    with pytest.raises(ValueError, match=r"100 audio frames make 13 audio tokens; the prompt has 1"):
        chat.model.request([151644, 872, 198, 151675, 151645, 198, 151644, 77091, 198], features=torch.zeros(128, 100))
    with pytest.raises(ValueError, match="prompt token ids must be in"):
        chat.model.request([10**7])


def test_a_failing_request_leaves_the_others_served(chat):
    """Features that pass the request's checks but not the encoder's (NaN) fail that request in the
    engine; a text request beside it completes with what it gets alone."""
    good = dict(thinker_max_tokens=4, talker_max_tokens=6, seed=7)  # the Talker samples: same seed, same codes

    async def main():
        async with Conductor(chat.graph(), chat.modules(), config=FP32) as c:
            alone = await c.submit(
                chat.model.request([151644, 872, 198, 100, 151645, 198, 151644, 77091, 198], **good)
            ).collect()
            features = torch.full((128, 100), float("nan"))
            bad = chat.model.request(
                [151644, 872, 198, 151669, *[151675] * 13, 151670, 151645, 198, 151644, 77091, 198],
                features=features,
                **good,
            )
            ok = chat.model.request([151644, 872, 198, 100, 151645, 198, 151644, 77091, 198], **good)
            results = await asyncio.gather(c.submit(bad).collect(), c.submit(ok).collect(), return_exceptions=True)
            return alone, results

    alone, (bad, ok) = asyncio.run(main())
    assert isinstance(bad, RequestError) and "NaN or infinite" in str(bad)
    assert [int(t) for t in ok["text_ids"]] == [int(t) for t in alone["text_ids"]]
    assert torch.equal(torch.stack(ok["codes"]), torch.stack(alone["codes"]))
