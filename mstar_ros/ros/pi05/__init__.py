"""The pi0.5 policy's ROS side: its node (one per robot), the node's parts, its parameters.

Only ``policy_node`` and the node's parts import rclpy at their top: import them where ROS runs.
"""
