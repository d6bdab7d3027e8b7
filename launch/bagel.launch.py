"""BAGEL as ROS 2 nodes: ``ros2 launch mstar_ros bagel.launch.py [robots:='/robot1'] [weights:=DIR]``.

One process (``mstar_bagel_node_set``) hosts the Conductor, ``/mstar/conductor`` and one ``bagel`` node per
namespace: questions on NS/bagel/question (std_msgs/String) about the latest frame of
NS/camera/exterior/image_raw are answered on NS/bagel/answer; an instruction on NS/bagel/edit
(std_msgs/String, e.g. "the cup in the drawer") edits that frame into a goal image on NS/goal_image
(sensor_msgs/Image rgb8): see mstar_ros/ros/bagel/bagel_node.py. Parameters: config/bagel.yaml. Launch
arguments and the process come from mstar_ros.launch_spec_bagel (BAGEL_LAUNCH_ARGUMENTS, bagel_processes).
When the node set exits the launch ends (non-zero, with its one-line error, when it failed).
use_sim_time:=true: the nodes keep time by /clock.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration

from mstar_ros.launch_actions import node_actions
from mstar_ros.launch_spec_bagel import BAGEL_LAUNCH_ARGUMENTS, bagel_processes


def _nodes(context, *args, **kwargs):
    values = {arg.name: LaunchConfiguration(arg.name).perform(context) for arg in BAGEL_LAUNCH_ARGUMENTS}
    return node_actions(bagel_processes(**values))


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(arg.name, default_value=arg.default, description=arg.description)
            for arg in BAGEL_LAUNCH_ARGUMENTS
        ]
        + [OpaqueFunction(function=_nodes)]
    )
