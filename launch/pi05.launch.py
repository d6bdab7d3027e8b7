"""The pi0.5 node set: ``ros2 launch mstar_ros pi05.launch.py [robots:='/robot1 /robot2'] ...``.

Launch arguments (``ros2 launch mstar_ros pi05.launch.py --show-args``): robots, weights,
placement, rate, max_inflight, params_file, prompt, status_every, tokenizer, asset_id, dtype,
use_sim_time -- see mstar_ros.launch_spec.LAUNCH_ARGUMENTS. With use_sim_time:=true every node
keeps time by /clock, for a bag replayed with its recorded stamps (``bag play --clock``). The processes, their arguments, parameters file
(config/pi05.yaml by default) and remappings come from mstar_ros.launch_spec, the one
description of the node set that ``mstar-ros launch pi05`` starts too where the ROS 2 launch
tools are not installed.

When the node set exits the launch ends: with status 0 after a clean exit, non-zero with the
node set's one-line error when it fails (bad weights path, bad placement; see
mstar_ros.launch_actions).

The node set process hosts several nodes (/mstar/conductor and one pi05_policy per robot
namespace), so no ``name`` or ``namespace`` is given to the Node action: ``__node`` and
``__ns`` remappings would rename every node in the process. Remap topics with
``launch_ros.actions.SetRemap`` in an including launch file, or with ``-r`` rules given to
``mstar-ros launch pi05 ... --ros-args``.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration

from mstar_ros.launch_actions import node_actions
from mstar_ros.launch_spec import LAUNCH_ARGUMENTS, pi05_processes


def _node_set(context, *args, **kwargs):
    values = {arg.name: LaunchConfiguration(arg.name).perform(context) for arg in LAUNCH_ARGUMENTS}
    return node_actions(pi05_processes(**values))


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(arg.name, default_value=arg.default, description=arg.description)
            for arg in LAUNCH_ARGUMENTS
        ]
        + [OpaqueFunction(function=_node_set)]
    )
