"""``priority`` on /v1/chat/completions: our extension field, checked like OpenAI's own fields."""

from __future__ import annotations

import msgspec
import pytest

from mstar_ros.webrtc.chat_params import ChatBody, check_chat_params
from mstar_ros.webrtc.openai_errors import APIError


def body(**fields) -> ChatBody:
    return msgspec.convert({"messages": [{"role": "user", "content": "hi"}], **fields}, ChatBody)


def test_a_class_name_is_taken():
    check_chat_params(body(priority="batch"))
    assert body().priority is None  # the model's default class


def test_an_unknown_class_is_a_400_naming_the_field():
    with pytest.raises(APIError) as err:
        check_chat_params(body(priority="urgent"))
    assert err.value.status == 400 and err.value.param == "priority"
    assert "control, interactive, batch" in err.value.message
