"""The whole edge box: ``ros2 launch mstar_ros edge.launch.py [config:=my_edge.yaml]``.

Launch arguments (``--show-args``): config, status_every, dtype, use_sim_time -- see
mstar_ros.edge.launch_spec.EDGE_LAUNCH_ARGUMENTS. The config (config/edge.yaml by default) says which
front-ends run -- pi0.5 for the robots, the voice gateway, BAGEL images on the gateway's OpenAI routes
-- grouped into processes, and the intra-op threads of each; one ``mstar_edge_host`` process per group
(mstar_ros.edge.launch_spec, which ``mstar-ros launch edge`` starts too). A bad config fails the launch
before anything starts, naming the file, line and field. When a process exits the launch ends, non-zero
with its one-line error when it failed (mstar_ros.launch_actions).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration

from mstar_ros.edge.launch_spec import EDGE_LAUNCH_ARGUMENTS, edge_processes
from mstar_ros.launch_actions import node_actions


def _processes(context, *args, **kwargs):
    values = {arg.name: LaunchConfiguration(arg.name).perform(context) for arg in EDGE_LAUNCH_ARGUMENTS}
    return node_actions(edge_processes(**values))


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(arg.name, default_value=arg.default, description=arg.description)
            for arg in EDGE_LAUNCH_ARGUMENTS
        ]
        + [OpaqueFunction(function=_processes)]
    )
