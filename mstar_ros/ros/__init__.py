"""The ROS 2 face of the runtime, grouped by what it serves.

- ``common``: message conversion, /diagnostics, the ROS process, Worker health, the Conductor's node;
- ``pi05``: the pi0.5 policy node and its parts; ``vjepa2``: the V-JEPA 2-AC world-model node;
- ``partition``: a graph or partition as a node; ``orpheus``: the Orpheus talker's requests (its
  nodes are partition nodes);
- ``node_set``, ``vjepa2_node_set``, ``orpheus_node``, ``worker_diagnostics``: the processes
  (and the Worker plugin) that setup.py's entry points name.
"""
