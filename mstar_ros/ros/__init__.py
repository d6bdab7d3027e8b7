"""The ROS 2 face of the runtime: message conversion, the policy nodes, the node set."""
