"""The BAGEL node's input checks and its goal image, without ROS (messages as simple namespaces)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from mstar_ros.ros.bagel.frame_checks import check_frame, check_text, goal_pixels
from mstar_ros.ros.common.convert import ObservationError


def _msg(encoding="rgb8", width=8, height=4, channels=3, step=None, data_len=None):
    step = width * channels if step is None else step
    return types.SimpleNamespace(
        encoding=encoding,
        width=width,
        height=height,
        step=step,
        data=bytes(step * height if data_len is None else data_len),
    )


def test_a_good_frame_passes_and_each_bad_one_names_its_field():
    check_frame(_msg(), topic="/cam", max_side=64)
    check_frame(_msg("mono8", channels=1), topic="/cam", max_side=64)
    for msg, says in [
        (_msg("rgba8", channels=4), "/cam: image encoding 'rgba8' is not supported"),
        (_msg(step=10), "/cam: step 10 is less than width x channels = 24"),
        (_msg(data_len=5), "/cam: 5 bytes of data, expected step x height = 96"),
        (_msg(width=65), "/cam: image width 65 is over max_image_side 64"),
        (_msg(height=100, data_len=0), "/cam: image height 100 is over max_image_side 64"),
        (_msg(width=0), "/cam: image is 0x4"),
    ]:
        with pytest.raises(ObservationError, match=says):
            check_frame(msg, topic="/cam", max_side=64)


def test_texts_are_stripped_and_empty_or_long_ones_refused():
    assert check_text("  what is this?\n", topic="/q", what="question", max_chars=20) == "what is this?"
    with pytest.raises(ObservationError, match="/q: data is empty \\(a question is needed\\)"):
        check_text(" \t", topic="/q", what="question", max_chars=20)
    with pytest.raises(ObservationError, match="/e: data is 21 characters, over max_text_chars 20"):
        check_text("x" * 21, topic="/e", what="instruction", max_chars=20)


def test_the_goal_image_takes_its_frames_size():
    edited = np.arange(16 * 32 * 3, dtype=np.uint8).reshape(16, 32, 3)
    assert goal_pixels(edited, None) is not None and goal_pixels(edited, None).shape == (16, 32, 3)
    assert np.array_equal(goal_pixels(edited, (16, 32)), edited)
    resized = goal_pixels(edited, (24, 40))
    assert resized.shape == (24, 40, 3) and resized.dtype == np.uint8
    with pytest.raises(ValueError, match="must be \\[H, W, 3\\] uint8"):
        goal_pixels(edited.astype(np.float32), (16, 32))


def test_parameters_are_validated_naming_the_parameter():
    from mstar_ros.ros.bagel.params import PARAMETERS, validate

    good = {name: default for name, (default, _) in PARAMETERS.items()}
    assert validate(good, "/r/bagel", 250).goal_topic == "goal_image"
    for change, says in [
        ({"edit_steps": 1}, "/r/bagel: parameter edit_steps: Expected `int` >= 2"),
        ({"edit_steps": 300}, "parameter edit_steps: 300 is over the model's 250"),
        ({"max_pending": 0}, "parameter max_pending"),
        ({"camera_topic": ""}, "parameter camera_topic"),
        ({"temperature": "hot"}, "parameter temperature: Expected `float`"),
        ({"goal_topic": "bagel/question"}, "parameters goal_topic, question_topic: the same topic"),
    ]:
        with pytest.raises(ValueError, match=says):
            validate({**good, **change}, "/r/bagel", 250)
