"""V-JEPA 2-AC world models as ROS 2 nodes: ``ros2 launch mstar_ros vjepa2.launch.py robots:='/robot1 /robot2'``.

One process (``mstar_vjepa2_node_set``) hosts the Conductor, ``/mstar/conductor`` and one
``world_model`` node per robot namespace (camera + end-effector pose + gripper in; plans toward
a goal image out as PoseStamped / nav_msgs/Path / gripper target; see
mstar_ros/ros/vjepa2/world_model_node.py), with config/vjepa2.yaml. Launch arguments and the process
come from mstar_ros.launch_spec (VJEPA2_LAUNCH_ARGUMENTS, vjepa2_processes), which ``mstar-ros
launch vjepa2`` starts too where the ROS 2 launch tools are not installed. When the node set
exits the launch ends (non-zero, with its one-line error, when it failed).
use_sim_time:=true: the nodes keep time by /clock (a bag replayed with ``bag play --clock``).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration

from mstar_ros.launch_actions import node_actions
from mstar_ros.launch_spec import VJEPA2_LAUNCH_ARGUMENTS, vjepa2_processes


def _nodes(context, *args, **kwargs):
    values = {arg.name: LaunchConfiguration(arg.name).perform(context) for arg in VJEPA2_LAUNCH_ARGUMENTS}
    return node_actions(vjepa2_processes(**values))


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(arg.name, default_value=arg.default, description=arg.description)
            for arg in VJEPA2_LAUNCH_ARGUMENTS
        ]
        + [OpaqueFunction(function=_nodes)]
    )
