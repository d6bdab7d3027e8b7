"""The pi0.5 front-end of an edge process: its Conductor and one policy node per robot, on the process's loop.

What ``mstar_pi05_node_set`` serves, entered into an AsyncExitStack beside the other front-ends of the
process, so every Conductor of the process steps on its one device thread.
"""

from __future__ import annotations

import asyncio
import contextlib

from mstar_ros.edge.classes import classed_conductor
from mstar_ros.edge.config import EdgeFile, Pi05Front
from mstar_ros.edge.engine_settings import front_engine_config


async def start_pi05(stack: contextlib.AsyncExitStack, front: Pi05Front, edge: EdgeFile, dtype: str | None, ros):
    """Loads pi0.5, starts its Conductor (closed by ``stack``) and adds its nodes to ``ros`` (a RosProcess):
    (the policy, its Conductor, the policy nodes)."""
    from mstar_graphs.pi05.frontend import Pi05Policy
    from mstar_ros.launch_spec import parse_robots
    from mstar_ros.policy.admission import ChunkAdmission
    from mstar_ros.ros.common.conductor_node import ConductorNode
    from mstar_ros.ros.pi05.policy_node import PolicyNode

    policy = Pi05Policy.load(edge.path(front.weights) or None)
    config = front_engine_config(edge.path(front.engine_config), dtype)
    conductor = await stack.enter_async_context(
        classed_conductor(policy.graph(), policy.modules(), config, front.priority, front.class_limits)
    )
    admission = ChunkAdmission(front.max_inflight)
    loop = asyncio.get_running_loop()
    nodes = [PolicyNode(policy, conductor, loop, ns, admission=admission) for ns in parse_robots(front.robots)]
    ros.add(*nodes, ConductorNode(conductor))
    return policy, conductor, nodes


def pi05_ros_arguments(front: Pi05Front, edge: EdgeFile, user: list[str]) -> list[str]:
    """The process's ROS arguments: the params file (config/pi05.yaml unless the config names one), the
    user's ``--ros-args`` after it, then the config's rate and prompt (as ``mstar_pi05_node_set`` puts
    ``--rate`` and ``--prompt``: they win over the file)."""
    import json

    from mstar_ros.launch_spec import default_params_file

    params = edge.path(front.params_file) or str(default_params_file())
    out = ["--ros-args", "--params-file", params, *user]
    if front.rate is not None:
        out += ["--ros-args", "-p", f"control_rate_hz:={float(front.rate)!r}"]
    if front.prompt.strip():
        out += ["--ros-args", "-p", f"prompt:={json.dumps(front.prompt)}"]  # quoted: 'yes' stays a string
    return out
