"""BAGEL imagines the goal, V-JEPA 2-AC plans toward it:
``ros2 launch mstar_ros bagel_vjepa2.launch.py [robots:='/robot1']``.

Two processes over the same robot namespaces: the BAGEL node set (``mstar_bagel_node_set``) and the
V-JEPA 2-AC node set (``mstar_vjepa2_node_set``). Both read NS/camera/exterior/image_raw; an instruction
on NS/bagel/edit (std_msgs/String, e.g. "the cup in the drawer") has NS/bagel edit the latest frame
into a goal image on NS/goal_image, the topic NS/world_model plans toward: NS/plan/target_pose,
NS/plan/path, NS/plan/gripper and NS/plan/energy after every frame from then on. Launch arguments
and processes come from mstar_ros.launch_spec_bagel (BAGEL_VJEPA2_LAUNCH_ARGUMENTS,
bagel_vjepa2_processes). When either process exits the launch ends (non-zero, with its one-line
error, when it failed). use_sim_time:=true: the nodes keep time by /clock.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration

from mstar_ros.launch_actions import node_actions
from mstar_ros.launch_spec_bagel import BAGEL_VJEPA2_LAUNCH_ARGUMENTS, bagel_vjepa2_processes


def _nodes(context, *args, **kwargs):
    values = {arg.name: LaunchConfiguration(arg.name).perform(context) for arg in BAGEL_VJEPA2_LAUNCH_ARGUMENTS}
    return node_actions(bagel_vjepa2_processes(**values))


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(arg.name, default_value=arg.default, description=arg.description)
            for arg in BAGEL_VJEPA2_LAUNCH_ARGUMENTS
        ]
        + [OpaqueFunction(function=_nodes)]
    )
