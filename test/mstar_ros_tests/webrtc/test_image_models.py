"""The image capability's pieces: events checked as they are made, sizes parsed, capabilities told apart."""

from __future__ import annotations

import numpy as np
import pytest

from mstar_ros.webrtc.image_models import ImageEvent, ImageModel, makes_images, parse_size, speaks
from support.toy_image_model import ToyImageModel


def test_events_carry_an_image_exactly_when_they_should():
    image = np.zeros((4, 6, 3), np.uint8)
    assert ImageEvent("final", 0, image).image is image
    assert ImageEvent("progress", 1, step=2, steps=5).image is None
    with pytest.raises(ValueError, match="progress ImageEvent has no image"):
        ImageEvent("progress", 0, image)
    with pytest.raises(ValueError, match="final ImageEvent needs an image"):
        ImageEvent("final", 0)
    with pytest.raises(ValueError, match="HWC uint8 RGB"):
        ImageEvent("partial", 0, np.zeros((4, 6, 3), np.float32))
    with pytest.raises(ValueError, match="kind 'done'"):
        ImageEvent("done", 0)


def test_sizes_parse_or_name_the_field():
    assert parse_size("1024x768") == (1024, 768) and parse_size("auto") is None and parse_size(None) is None
    for bad in ("foo", "13", "0x8", "-8x8", "8x"):
        with pytest.raises(ValueError, match="--size"):
            parse_size(bad, "--size")


def test_the_toy_has_the_capability_and_does_not_speak():
    model = ToyImageModel()
    assert isinstance(model, ImageModel) and makes_images(model) and not speaks(model)
    assert not makes_images(object())
