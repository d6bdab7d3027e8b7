"""The Orpheus talker's ``priority`` ROS parameter (mstar_ros.ros.orpheus.talker_requests): interactive unless
set, at start (-p) or while it runs, and a bad class is refused naming it. A stand-in node, no DDS."""

from __future__ import annotations

import types

from mstar.priority import Priority
from mstar.sampling_params import SamplingParams
from mstar_graphs.orpheus.tiny_llm import build_tokenizer
from mstar_ros.ros.orpheus.talker_requests import SpeechDefaults, bind_parameters, request_factory


class ParamNode:
    """What bind_parameters uses of an rclpy Node; ``given`` stands for ``-p NAME:=VALUE`` at start."""

    def __init__(self, **given) -> None:
        self.values, self.given, self.on_set = {}, given, None

    def declare_parameter(self, name, value):
        self.values[name] = self.given.get(name, value)

    def get_parameter(self, name):
        return types.SimpleNamespace(value=self.values[name])

    def add_on_set_parameters_callback(self, callback):
        self.on_set = callback

    def set(self, name, value):
        return self.on_set([types.SimpleNamespace(name=name, value=value)])


def talker(**given):
    defaults = SpeechDefaults("tara", SamplingParams(max_tokens=8))
    node = ParamNode(**given)
    bind_parameters(node, defaults)
    build = request_factory(build_tokenizer(), 4096, defaults)
    return node, lambda: build("Hello.", "r", 0, {}).priority


def test_speech_is_interactive_unless_the_parameter_says_otherwise():
    node, priority_of_next = talker()
    assert node.values["priority"] == "interactive" and priority_of_next() is Priority.INTERACTIVE
    _node, priority_of_next = talker(priority="batch")
    assert priority_of_next() is Priority.BATCH


def test_a_running_talker_takes_a_new_class_and_refuses_a_bad_one():
    node, priority_of_next = talker()
    assert node.set("priority", "control").successful and priority_of_next() is Priority.CONTROL
    refused = node.set("priority", "urgent")
    assert not refused.successful and "priority: 'urgent' is not a priority class" in refused.reason
    assert priority_of_next() is Priority.CONTROL
