"""Orpheus TTS as ROS 2 nodes: ``ros2 launch mstar_ros orpheus.launch.py [split:=true] [namespace:=/tts]``.

With split:=true (the default) the graph's two partitions run as two nodes in two processes:
/tts/orpheus_talker (text -> LLM -> audio tokens on /tts/llm_token) and /tts/orpheus_vocoder
(/tts/llm_token -> SNAC -> 24 kHz PCM on /tts/audio); the streaming edge between them is that
topic (``ros2 topic echo /tts/llm_token``). Launch arguments and processes come from
mstar_ros.launch_spec (ORPHEUS_LAUNCH_ARGUMENTS, orpheus_processes), which ``mstar-ros launch
orpheus`` starts too where the ROS 2 launch tools are not installed. Each process hosts its
partition node and its Conductor's node, so no ``name``/``namespace`` is given to the Node
action; the namespace is the ``namespace`` argument. When either process exits the launch
ends (non-zero, with its one-line error, when it failed: see mstar_ros.launch_actions).
use_sim_time:=true: the nodes keep time by /clock.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration

from mstar_ros.launch_actions import node_actions
from mstar_ros.launch_spec import ORPHEUS_LAUNCH_ARGUMENTS, orpheus_processes


def _nodes(context, *args, **kwargs):
    values = {arg.name: LaunchConfiguration(arg.name).perform(context) for arg in ORPHEUS_LAUNCH_ARGUMENTS}
    return node_actions(orpheus_processes(**values))


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(arg.name, default_value=arg.default, description=arg.description)
            for arg in ORPHEUS_LAUNCH_ARGUMENTS
        ]
        + [OpaqueFunction(function=_nodes)]
    )
