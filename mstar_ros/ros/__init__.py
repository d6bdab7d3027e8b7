"""The ROS 2 face of the runtime, grouped by what it serves.

- ``common``: message conversion, /diagnostics, the ROS process, Worker health, the Conductor's node,
  the Worker plugin that reports Worker status on /diagnostics;
- ``pi05``: the pi0.5 node set (``node_set``), the policy node and its parts;
- ``vjepa2``: the V-JEPA 2-AC node set and its world-model node;
- ``orpheus``: the Orpheus node set and its talker's requests (its nodes are partition nodes);
- ``partition``: a graph or partition as a node.

Each ``node_set`` module is the process a console script of setup.py starts.
"""
